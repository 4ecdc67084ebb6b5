"""
What the soak writes down as it runs, one JSON object a line, and reads back to check.

- ``ops``: every operation a workload issued, classified as the guarantees page defines it
  (:func:`classify`): ``ok`` (committed), ``fail`` (not committed) or ``info`` (unknown);
- ``discards``: every connection a client discarded, with its backend's id and the time, so that
  the sampler can tell a discarded backend from a live one;
- ``anomalies``: what a process found wrong as it ran (a bank total that moved, an error of a kind
  no fault explains, something asyncio's exception handler was given);
- ``faults``: what the nemesis did, and when.

Each process writes files of its own (``<kind>-<process>.jsonl``) in the run's directory (a job's
successive runs append to one); a file is flushed line by line, so a SIGKILLed job loses at most
the line it was writing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

__all__ = ["Cls", "Lines", "classify", "read_all"]

Cls = Literal["ok", "fail", "info"]


class Lines:
    """An append-only file of JSON lines, safe to write from any thread of one process."""

    def __init__(self, directory: Path, kind: str, name: str) -> None:
        self.path = directory / f"{kind}-{name}.jsonl"
        self._file = self.path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def write(self, **record: Any) -> None:
        record.setdefault("t", time.time())
        line = json.dumps(record, default=str, separators=(",", ":"))
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_all(directory: Path, kind: str) -> Iterator[dict[str, Any]]:
    """Every record of ``kind`` written in ``directory``, file after file; a torn last line is skipped."""
    for path in sorted(directory.glob(f"{kind}-*.jsonl")):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a process killed while writing it


def classify(returned: bool, outcome: Any | None) -> tuple[Cls, str]:
    """
    How the guarantees page classifies a ``submit()`` call: ``(class, why)``.

    ``returned``: the call returned its unit's value. ``outcome``: the :class:`boundeddb.Outcome`
    its ``on_outcome`` hook was given, if it was called. A call that raised (its unit's error, or the
    cancellation) is ``info`` if its outcome says ``commit_unknown``, else ``fail``; a cancelled call
    whose hook was never called withdrew its unit, which never commits.
    """
    if returned:
        return "ok", "returned"
    if outcome is None:
        return "fail", "no outcome"
    if outcome.ok:  # cancelled once its COMMIT had begun, and it committed
        return "ok", "outcome ok"
    if outcome.commit_unknown:
        return "info", "commit unknown"
    return "fail", type(outcome.error).__name__
