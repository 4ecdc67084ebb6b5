"""
boundeddb: push many SQLAlchemy units of work through a connection pool without exhausting it.

Three runners share one contract — a new session and transaction per unit, commit on success,
rollback on failure, at most ``limit`` units and so at most ``limit`` connections in flight:

- :class:`SemaphoreRunner` — async units in a sliding window.
- :class:`ChunkedRunner` — async units in fixed chunks with a barrier between them.
- :class:`ThreadOffloadRunner` — sync units in a bounded thread pool, from asyncio, trio or sync code.

:class:`ProcessRunner` spreads ``fn(session, item)`` over worker processes or a Dask cluster
under one connection budget, each worker running one of the first and third.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from ._autolimit import AutoLimit
from ._batch import BatchPolicy
from ._errors import (
    BoundedDBError,
    LoadFailed,
    RowRefused,
    RunFailed,
    RunnerBusyElsewhereError,
    RunnerClosedError,
    UnitMisuseError,
    UnitTimeout,
    UnpicklableError,
    WorkerLostError,
    WorkerStartError,
)
from ._journal import Journal
from ._outcome import LoadReport, Outcome, RejectedRow, RunReport
from ._pgbouncer import pgbouncer_engine_options
from ._processes.runner import ProcessRunner
from ._retry import RetryPolicy, is_transient
from ._runners.chunked import ChunkedRunner
from ._runners.semaphore import SemaphoreRunner
from ._runners.thread_offload import ThreadOffloadRunner
from ._stats import RunnerStatistics, RunStats
from ._telemetry import instrument, uninstrument

try:
    __version__ = _version("boundeddb")
except _PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
    __version__ = "0.0.0"

__all__ = [
    "AutoLimit",
    "BatchPolicy",
    "BoundedDBError",
    "ChunkedRunner",
    "Journal",
    "LoadFailed",
    "LoadReport",
    "Outcome",
    "ProcessRunner",
    "RejectedRow",
    "RetryPolicy",
    "RowRefused",
    "RunFailed",
    "RunReport",
    "RunStats",
    "RunnerBusyElsewhereError",
    "RunnerClosedError",
    "RunnerStatistics",
    "SemaphoreRunner",
    "ThreadOffloadRunner",
    "UnitMisuseError",
    "UnitTimeout",
    "UnpicklableError",
    "WorkerLostError",
    "WorkerStartError",
    "__version__",
    "instrument",
    "is_transient",
    "pgbouncer_engine_options",
    "uninstrument",
]

# Public paths in reprs, tracebacks, pickles and Sphinx, as trio and httpx do.
for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and not isinstance(_obj, str):
        _obj.__module__ = __name__
del _name, _obj
