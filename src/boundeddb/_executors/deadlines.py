"""
The thread that stops a thread unit's statement at its ``timeout``.

:class:`StatementDeadlines` serves databases where the server cannot be told a statement timeout:
MySQL, MariaDB and SQLite. A unit past its deadline is never committed, and its connection is
discarded. See "Sync units: lanes and handles" in ``docs/explanation/architecture.md``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._dialects import Dialect

__all__ = ["HasDeadline", "StatementDeadlines"]

logger = logging.getLogger("boundeddb.timeout")

#: The bounds of the thread's tick: a twentieth of the timeout, within them.
MIN_TICK_S = 0.005
MAX_TICK_S = 0.05
#: How long the thread waits with no deadline to keep before it ends. A new deadline starts another.
IDLE_S = 1.0


class HasDeadline(Protocol):
    """A worker's handle, ``threads.Handle``, as the deadlines see it."""

    #: The ``perf_counter()`` when the attempt's statement is to be stopped; ``inf``: never.
    deadline: float

    def time_out(self, now: float) -> Any:
        """Mark the attempt timed out if it is past its deadline: the DBAPI connection to stop, if any."""
        ...


class StatementDeadlines:
    """Stops the statements of a runner's thread units that outlast ``timeout``. See the module docstring."""

    __slots__ = ("_dialect", "_handles", "_lock", "_thread", "_tick", "timeout")

    def __init__(self, dialect: Dialect, timeout: float) -> None:
        self._dialect = dialect
        self.timeout = timeout
        self._tick = min(MAX_TICK_S, max(MIN_TICK_S, timeout / 20))
        self._handles: weakref.WeakSet[HasDeadline] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def adopt(self, handle: HasDeadline) -> None:
        """Keep ``handle``'s attempts to their deadlines from now on, for as long as the handle lives."""
        with self._lock:
            self._handles.add(handle)

    def wake(self) -> None:
        """Make sure the thread runs: a handle has just set a deadline."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._patrol, name="boundeddb-deadlines", daemon=True
                    )
                    self._thread.start()

    def _armed(self) -> tuple[HasDeadline, ...]:
        with self._lock:
            return tuple(handle for handle in self._handles if handle.deadline != math.inf)

    def _patrol(self) -> None:
        idle_since = perf_counter()
        while True:
            time.sleep(self._tick)
            armed = self._armed()
            now = perf_counter()
            if armed:
                idle_since = now
                due = [dbapi for handle in armed if (dbapi := handle.time_out(now)) is not None]
                if due:
                    logger.debug("timeout=%s: stopping %d unit(s)' statement(s)", self.timeout, len(due))
                    self._stop(due)
            elif now - idle_since > IDLE_S:
                with self._lock:  # a deadline set before wake() read _thread is seen here
                    if not any(handle.deadline != math.inf for handle in self._handles):
                        self._thread = None
                        return

    def _stop(self, dbapi_connections: list[Any]) -> None:
        try:
            self._dialect.cancel_statements(dbapi_connections)
        except Exception:  # never let the thread die: the units are marked and will not commit
            logger.exception("stopping timed-out units' statements failed")
