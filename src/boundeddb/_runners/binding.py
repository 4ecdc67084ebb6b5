"""Which event loop a runner's calls use: one at a time, since its limiter's primitives are that loop's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import anyio.lowlevel

from .._errors import RunnerBusyElsewhereError

__all__ = ["LoopBinding"]


class LoopBinding:
    """Counts a runner's calls in flight and the loop they run on; refuses a second loop meanwhile."""

    __slots__ = ("_calls", "_lock", "_name", "_token")

    def __init__(self, runner: str) -> None:
        self._name = runner
        self._token: object = None
        self._calls = 0
        self._lock = threading.Lock()

    @contextmanager
    def bound(self) -> Iterator[None]:
        """Use the runner from the current event loop, refusing a second loop while one is busy."""
        token = anyio.lowlevel.current_token()
        with self._lock:
            if self._calls and self._token != token:
                msg = (
                    f"this {self._name} has work in flight on another event loop; its limit "
                    "is enforced within one loop at a time. Create one runner per event loop "
                    "(or per thread calling run_sync) — they can share the engine."
                )
                raise RunnerBusyElsewhereError(msg)
            self._token = token
            self._calls += 1
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1
