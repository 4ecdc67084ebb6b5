"""
The runners' listeners on an engine's pool events, which tell them what the pool does.

:func:`track_peak` counts the most connections checked out at once during a run, for ``RunStats``.
With :func:`install_connect_hooks`, the engine tells the worker whose task opens a connection that it
does, then which connection its task checked out, through :data:`HOOKS`. So a worker knows what
not to interrupt, and which connection to discard, without asking the session for it.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool, PoolProxiedConnection, QueuePool

__all__ = ["HOOKS", "ConnectHooks", "PeakTracker", "install_connect_hooks", "track_peak"]


class ConnectHooks(Protocol):
    """What a worker's task is told about the connections its engine gives it."""

    def on_opening(self) -> None:
        """The task starts opening a new DBAPI connection."""

    def on_checkout(self, connection: PoolProxiedConnection) -> None:
        """The task checked ``connection`` out of the pool. A new one is open by then."""


#: In a worker's task: the hooks of that worker.
HOOKS: contextvars.ContextVar[ConnectHooks | None] = contextvars.ContextVar("boundeddb_hooks", default=None)


class _CheckoutGauge:
    """Counts connections checked out of one pool, through its events, for any thread."""

    def __init__(self, pool: Pool) -> None:
        self._lock = threading.Lock()
        self.current = pool.checkedout() if isinstance(pool, QueuePool) else 0
        self._trackers: set[PeakTracker] = set()
        event.listen(pool, "checkout", self._on_checkout)
        event.listen(pool, "checkin", self._on_checkin)

    def _on_checkout(self, *_: Any) -> None:
        with self._lock:
            self.current += 1
            for tracker in self._trackers:
                if self.current > tracker.peak:
                    tracker.peak = self.current

    def _on_checkin(self, *_: Any) -> None:
        with self._lock:
            self.current = max(0, self.current - 1)

    def tracker(self) -> PeakTracker:
        with self._lock:
            tracker = PeakTracker(self, self.current)
            self._trackers.add(tracker)
            return tracker

    def drop(self, tracker: PeakTracker) -> None:
        with self._lock:
            self._trackers.discard(tracker)


class PeakTracker:
    """A ``CheckoutPeak``: the most connections checked out of one pool at once since a run began."""

    __slots__ = ("__weakref__", "gauge", "peak")

    def __init__(self, gauge: _CheckoutGauge, peak: int) -> None:
        self.gauge = gauge
        self.peak = peak

    def close(self) -> None:
        self.gauge.drop(self)


_gauges: weakref.WeakKeyDictionary[Pool, _CheckoutGauge] = weakref.WeakKeyDictionary()
_connects: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()


def track_peak(pool: Pool) -> PeakTracker:
    """Start recording the peak number of connections checked out of ``pool``."""
    with _lock:
        gauge = _gauges.get(pool)
        if gauge is None:
            gauge = _gauges[pool] = _CheckoutGauge(pool)
    return gauge.tracker()


def _on_do_connect(*_: Any) -> None:
    hooks = HOOKS.get()
    if hooks is not None:
        hooks.on_opening()


def _on_checkout(_dbapi_connection: Any, _record: Any, connection: PoolProxiedConnection) -> None:
    hooks = HOOKS.get()
    if hooks is not None:
        hooks.on_checkout(connection)


def install_connect_hooks(engine: Engine) -> None:
    """Make ``engine`` call the current task's :data:`HOOKS` as it opens and checks out connections."""
    with _lock:
        if engine not in _connects:
            event.listen(engine, "do_connect", _on_do_connect)
            event.listen(engine.pool, "checkout", _on_checkout)
            _connects.add(engine)
