"""
Which event loop a runner's calls use: one at a time, or a private one for the ``*_sync`` verbs.

A runner's limiter belongs to the loop its calls run on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio.lowlevel

from .._errors import RunnerBusyElsewhereError

__all__ = ["LoopBinding", "run_blocking"]

T = TypeVar("T")


def run_blocking(call: Callable[[], Awaitable[T]], verb: str, instead: str) -> T:
    """
    Run ``call()`` on a private event loop in this thread, for a runner's ``*_sync`` verb.

    Ctrl-C is a :exc:`KeyboardInterrupt` once the call has cleaned up, on every Python: on 3.10,
    anyio's runner cancels the call but, without ``Task.uncancel``, cannot tell that cancellation
    from others, and lets the :exc:`~asyncio.CancelledError` out instead.

    Raises:
        RuntimeError: if an event loop runs in this thread already. The message says to await
            ``instead``.
    """
    try:
        anyio.lowlevel.current_token()
    except RuntimeError:
        pass  # no event loop here: good
    else:
        msg = f"{verb}() was called from async code, where it would block the event loop: use `{instead}`"
        raise RuntimeError(msg)
    try:
        return anyio.run(call)
    except (
        asyncio.CancelledError
    ):  # pragma: no cover - Python 3.10: only Ctrl-C cancels the private loop's call
        raise KeyboardInterrupt from None


class LoopBinding:
    """Counts a runner's calls in flight and the loop they run on, and refuses a second loop meanwhile."""

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
