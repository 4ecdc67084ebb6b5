"""
The list of scenarios, in the order a run takes them, and the look-ups over it.

``memory`` comes first (memory that other scenarios freed but the allocator kept would hide the
growth it measures), then the throughput rows, then the studies.
"""

from __future__ import annotations

from ..scenario import Scenario
from . import (
    async_unbounded,
    auto_limit,
    batching,
    chunked,
    fleet,
    gevent_pool,
    hand_rolled,
    instructions,
    journal,
    limit_sweep,
    load,
    load_parents,
    loop_lag,
    memory,
    mixed_priorities,
    overhead,
    parity,
    post002_mysql_sync_vs_async,
    post004_ping_under_slow_requests,
    processes,
    raw_asyncpg,
    semaphore,
    sync,
    threads,
)

ALL: tuple[Scenario, ...] = (
    memory.SCENARIO,
    sync.SCENARIO,
    async_unbounded.SCENARIO,
    chunked.SCENARIO,
    semaphore.SCENARIO,
    semaphore.BATCH50,
    semaphore.ASYNCMY,
    threads.SCENARIO,
    threads.PSYCOPG2,
    threads.MYSQLDB,
    gevent_pool.SCENARIO,
    hand_rolled.SCENARIO,
    raw_asyncpg.SCENARIO,
    overhead.SCENARIO,
    parity.SCENARIO,
    instructions.SCENARIO,
    limit_sweep.SCENARIO,
    auto_limit.SCENARIO,
    mixed_priorities.SCENARIO,
    fleet.SCENARIO,
    processes.SCENARIO,
    batching.SCENARIO,
    batching.SIZES_SCENARIO,
    journal.SCENARIO,
    load.SCENARIO,
    load_parents.SCENARIO,
    loop_lag.SCENARIO,
    post004_ping_under_slow_requests.SCENARIO,
    post002_mysql_sync_vs_async.SCENARIO,
)
BY_NAME: dict[str, Scenario] = {s.name: s for s in ALL}


def on(database: str) -> list[Scenario]:
    """The scenarios that run on ``database`` (``postgresql`` or ``mysql``), in run order."""
    return [s for s in ALL if database in s.databases]


def default_set(database: str) -> list[Scenario]:
    """What a run on ``database`` without ``--scenario`` or ``--full`` runs."""
    return [s for s in on(database) if s.default]
