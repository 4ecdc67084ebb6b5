"""
The soak's verdict: the operations' history against what the databases hold at the end.

Each operation was written down as ``ok`` (committed), ``fail`` (not committed) or ``info``
(unknown), as the guarantees page defines them for ``submit()``. Then:

- every ``ok`` write is present exactly once (``lost`` if absent, ``doubled`` if twice);
- every ``fail`` write is absent (``fail-present``);
- every ``info`` write is present at most once (``doubled``);
- no row is there that no operation wrote (``invented``);
- the bank's total is what it was, and each account's balance is what the transfers present say.

:func:`check` is pure: it takes the history and the counts, so the checker's own tests give it
histories that break each rule.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Anomaly", "Verdict", "bank_anomalies", "check"]

#: At most this many examples of each kind of anomaly in the report.
EXAMPLES = 5


@dataclasses.dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str


@dataclasses.dataclass
class Verdict:
    """Operations by workload and class, and the anomalies found, by kind."""

    ops: dict[str, collections.Counter[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    anomalies: dict[str, list[Anomaly]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )

    def add(self, kind: str, detail: str) -> None:
        self.anomalies[kind].append(Anomaly(kind, detail))

    @property
    def count(self) -> int:
        return sum(len(found) for found in self.anomalies.values())


def check(
    history: Iterable[Mapping[str, Any]], present: Mapping[str, int], verdict: Verdict | None = None
) -> Verdict:
    """
    Check ``history`` (records with ``op``, ``workload``, ``cls``, ``why``) against ``present``, how
    many rows each operation has in the database(s) its workloads write to.
    """
    verdict = verdict or Verdict()
    seen: set[str] = set()
    for record in history:
        op, workload, cls = record["op"], record["workload"], record["cls"]
        if op in seen:
            verdict.add("history", f"operation {op} written down twice")
            continue
        seen.add(op)
        verdict.ops[workload][cls] += 1
        rows = present.get(op, 0)
        why = record.get("why", "")
        if cls == "ok" and rows == 0:
            verdict.add("lost", f"{op}: ok ({why}) but absent")
        elif cls == "ok" and rows > 1:
            verdict.add("doubled", f"{op}: ok ({why}) but present {rows} times")
        elif cls == "fail" and rows > 0:
            verdict.add("fail-present", f"{op}: fail ({why}) but present {rows} time(s)")
        elif cls == "info" and rows > 1:
            verdict.add("doubled", f"{op}: info ({why}) but present {rows} times")
        elif cls == "info":
            verdict.ops[workload]["info-present" if rows else "info-absent"] += 1
    for op, rows in present.items():
        if op not in seen:
            verdict.add("invented", f"{op}: present {rows} time(s), written by no operation")
    return verdict


def bank_anomalies(
    balances: Mapping[int, int], transfers: Iterable[tuple[int, int, int]], opening: int, total: int
) -> list[str]:
    """What is wrong with the bank at the end: its total, or a balance its transfers do not explain."""
    problems = []
    if sum(balances.values()) != total:
        problems.append(f"total {sum(balances.values())}, not {total}")
    expected = collections.Counter({account: opening for account in balances})
    for source, target, amount in transfers:
        expected[source] -= amount
        expected[target] += amount
    wrong = {a: (balances[a], expected[a]) for a in balances if balances[a] != expected[a]}
    if wrong:
        shown = dict(list(wrong.items())[:EXAMPLES])
        problems.append(
            f"{len(wrong)} balances not what the transfers present say (balance, expected): {shown}"
        )
    return problems
