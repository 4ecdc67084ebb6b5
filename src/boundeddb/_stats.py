"""
The figures a runner reports, as frozen values: of one run, and of the runner now.

:class:`RunStats` holds one run's figures and :class:`RunnerStatistics` a runner's state now.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

__all__ = ["RunStats", "RunnerStatistics"]


@dataclasses.dataclass(frozen=True, slots=True)
class RunStats:
    """
    Figures for one run, measured by the runner while it ran.

    Latencies are those of the last attempt of each unit that started.
    ``peak_connections`` counts connections checked out of the engine's pool,
    observed through the pool's ``checkout``/``checkin`` events during the run.
    It includes connections that other code checked out of the same pool meanwhile.

    .. versionadded:: 0.1.0
    """

    #: Units pulled from the input and started.
    submitted: int
    #: Units that returned and committed.
    succeeded: int
    #: Units that failed and were rolled back.
    failed: int
    #: Wall-clock seconds from the start of the run to its end.
    elapsed_s: float
    #: Finished units, succeeded and failed, per second of ``elapsed_s``.
    throughput: float
    latency_p50_s: float
    latency_p95_s: float
    latency_p99_s: float
    latency_max_s: float
    #: Most units of this run in flight at once.
    peak_in_flight: int
    #: Most connections checked out of the pool at once while the run lasted.
    peak_connections: int
    #: 99th percentile of how late the event loop ran a 5 ms timer during the run.
    #: ``None`` where no event loop ran, as in :meth:`~boundeddb.ThreadOffloadRunner.run_sync`.
    loop_lag_p99_s: float | None = None
    #: The worst such lateness.
    loop_lag_max_s: float | None = None
    #: Attempts that failed and were tried again under the runner's retry policy.
    retried: int = 0
    #: The lowest the runner's limit was during the run. For a fixed limit, the limit.
    #:
    #: .. versionadded:: 0.2.0
    limit_min: int = 0
    #: The highest the limit was during the run.
    #:
    #: .. versionadded:: 0.2.0
    limit_max: int = 0
    #: The limit when the run ended.
    #:
    #: .. versionadded:: 0.2.0
    limit_final: int = 0
    #: ``(seconds since the run started, limit)`` at the start and at each change of a
    #: ``limit="auto"``. At most a few hundred points, thinned evenly on long runs.
    #:
    #: .. versionadded:: 0.2.0
    limit_trace: tuple[tuple[float, int], ...] = ()
    #: With ``verify_commits=True``, units whose last COMMIT lost its connection and whose fate the
    #: runner learned from the server instead of reporting ``commit_unknown``. See
    #: :attr:`Outcome.commit_verified <boundeddb.Outcome.commit_verified>`.
    #:
    #: .. versionadded:: 0.2.0
    commits_verified: int = 0
    #: Transactions of ``batch=`` that committed, each holding one or more units. 0 without batches.
    #:
    #: .. versionadded:: 0.3.0
    batches_committed: int = 0
    #: Units that ran in a batch that was rolled back, and so ran again: alone, or in a smaller batch,
    #: as :class:`~boundeddb.BatchPolicy` tells. 0 without batches.
    #:
    #: .. versionadded:: 0.3.0
    units_rerun: int = 0
    #: Units not run because their :class:`~boundeddb.Journal` row says an earlier run committed them.
    #: They count in neither ``submitted`` nor ``succeeded``. 0 without a journal.
    #:
    #: .. versionadded:: 0.3.0
    skipped: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerStatistics:
    """
    What a runner holds and what waits for it, at the moment of :meth:`~boundeddb.SemaphoreRunner.statistics`.

    It covers all the runner's calls, its runs, maps, streams and submits: the state now, and counters
    since the runner was made. The counters only grow, and a scraper turns them into rates. It is taken
    in a few microseconds, cheap enough for a metrics endpoint or a gauge callback.
    See :doc:`/how-to/observe`.

    .. versionadded:: 0.2.0
    """

    #: The most units in flight at once, now. It moves with ``limit="auto"``.
    limit: int
    #: Slots of the limit granted only to calls with ``priority > 0``.
    reserve: int
    #: Units holding a slot, and so a connection, now.
    in_flight: int
    #: Units of any call waiting for a slot.
    waiting: int
    #: ``waiting`` by priority. Priorities with no waiter are left out.
    waiting_by_priority: Mapping[int, int]
    #: ``in_flight`` by priority. Priorities with nothing in flight are left out.
    in_flight_by_priority: Mapping[int, int]
    #: Units of the runner that succeeded since it was made: every call's, ``submit()``'s included.
    #:
    #: .. versionadded:: 0.2.0
    succeeded: int = 0
    #: Units that failed since the runner was made.
    #:
    #: .. versionadded:: 0.2.0
    failed: int = 0
    #: Of the failed units, those whose COMMIT's fate is unknown: ``commit_unknown``.
    #:
    #: .. versionadded:: 0.2.0
    commit_unknown: int = 0
    #: Attempts that failed and were tried again, since the runner was made.
    #:
    #: .. versionadded:: 0.2.0
    retried: int = 0
    #: Seconds that settled units waited for a slot, in all: over a scrape interval, divided by the
    #: units settled in it, the mean wait.
    #:
    #: .. versionadded:: 0.2.0
    slot_wait_s: float = 0.0
    #: Transactions of ``batch=`` that committed since the runner was made.
    #:
    #: .. versionadded:: 0.3.0
    batches_committed: int = 0
    #: Units that ran again because their batch was rolled back, since the runner was made.
    #:
    #: .. versionadded:: 0.3.0
    units_rerun: int = 0
    #: Units skipped as done by a :class:`~boundeddb.Journal` since the runner was made.
    #:
    #: .. versionadded:: 0.3.0
    skipped: int = 0
    #: Rows that ``load()`` committed since the runner was made, counted as each chunk settles.
    #:
    #: .. versionadded:: 0.3.0
    rows_loaded: int = 0
    #: Rows that ``load()`` rejected, refused by the database, since the runner was made.
    #:
    #: .. versionadded:: 0.3.0
    rows_rejected: int = 0


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values, or 0.0 for none."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]
