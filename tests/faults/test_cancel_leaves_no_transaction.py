"""
A cancelled run leaves no transaction open on the server (issue #36).

The run of the issue: 1,000 units at limit 5 on a pool of 20, each writing a row, waiting 0.1-0.3 s
(even units in a sleep on the server, odd ones in ``anyio.sleep`` with the transaction open) and
writing a second row, cancelled from outside 0.7 s in (or as soon after as a unit is between its two
rows). Then no connection the engine ever opened
holds a transaction on the server within 1 s, no unit is half-written, and the next run on the same
runner is correct.

"Holds a transaction" is asked of the server without a cache: on MariaDB, ``SHOW ENGINE INNODB
STATUS`` (``information_schema.innodb_trx`` is refreshed only once nobody has read it for 100 ms, so
a poller every 50 ms sees its first snapshot for ever); on PostgreSQL, ``pg_stat_activity`` with a
transaction started (``idle in transaction``, or a statement still running). Connections are known
by the server's id, taken as the pool opens them, so one already gone from the process list counts.
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.kits import MYSQL_CASES, Kit
from tests.support.models import Item
from tests.support.servers import Database, MariaDB

#: Each case is marked postgres or mysql by its kind (conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("items_table", "collect_garbage")]

CASES = [("semaphore", "asyncio"), ("chunked", "asyncio")] + [
    case for case in MYSQL_CASES if not case[0].startswith("threads")
]
IDS = [kind for kind, _ in CASES]

UNITS = 1000
CANCEL_AFTER_S = 0.7
#: The promise: within this long of a cancelled run's return, none of its connections holds a transaction.
PROMISE_S = 1.0


class ServerIds:
    """The server's id of every connection the engine opens (MySQL thread ids, PostgreSQL backend pids)."""

    def __init__(self, kit: Kit) -> None:
        self.ids: set[int] = set()
        event.listen(kit.engine.sync_engine.pool, "connect", self._on_connect)

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        raw = dbapi_connection.driver_connection
        if hasattr(raw, "get_server_pid"):  # asyncpg
            self.ids.add(int(raw.get_server_pid()))
        else:  # aiomysql, asyncmy: from the handshake
            ident = raw.server_thread_id
            self.ids.add(int(ident[0] if isinstance(ident, tuple) else ident))


def holding_transactions(db: Database, ids: set[int]) -> list[tuple[int, str]]:
    """Which of the connections ``ids`` hold a transaction on the server, and what each is doing."""
    if isinstance(db, MariaDB):
        return [(ident, "in an InnoDB transaction") for ident in sorted(db.threads_in_transaction() & ids)]
    with db.admin.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT pid, state, query FROM pg_stat_activity "
                "WHERE pid = ANY(:ids) AND xact_start IS NOT NULL"
            ),
            {"ids": sorted(ids)},
        )
        return [(int(pid), f"{state}: {query}") for pid, state, query in rows]


class Marks:
    """Which units got past their first row, which wrote their second; when the run was cancelled."""

    def __init__(self) -> None:
        self.started: set[int] = set()
        self.finished: set[int] = set()
        self.a_start = anyio.Event()
        self.cancelled_at = 0.0

    def start(self, i: int) -> None:
        self.started.add(i)
        self.a_start.set()


def pausing_unit(kit: Kit, i: int, pause: float, marks: Marks) -> Any:
    """Write a row; wait ``pause`` s, on the server (even ``i``) or in Python (odd); write a second row."""
    sleep = text(kit.db.sleep)

    async def unit(session: AsyncSession) -> int:
        session.add(Item(key=f"k{i}a", unit=i))
        await session.flush()
        marks.start(i)
        if i % 2 == 0:
            await session.execute(sleep, {"s": pause})
        else:
            await anyio.sleep(pause)
        session.add(Item(key=f"k{i}b", unit=i))
        await session.flush()
        marks.finished.add(i)
        return i

    return unit


async def cancel_mid_unit(scope: anyio.CancelScope, marks: Marks) -> None:
    """
    Cancel ``scope`` 0.7 s in, once a unit is between its two rows (a chunk may be committing then,
    with none in flight, which a loaded machine makes likely).
    """
    await anyio.sleep(CANCEL_AFTER_S)
    if not marks.started - marks.finished:
        marks.a_start = anyio.Event()
        await marks.a_start.wait()
    marks.cancelled_at = time.monotonic()
    scope.cancel()


@pytest.mark.parametrize(("kind", "anyio_backend"), CASES, ids=IDS)
async def test_a_cancelled_run_leaves_no_transaction_on_the_server(cancel_kit: Kit) -> None:
    """Cancelled 0.7 s in: no transaction of its connections within 1 s, rows in pairs, next run correct."""
    kit = cancel_kit
    runner = kit.runner(limit=5, pool_size=20)
    server = ServerIds(kit)
    rng = random.Random(36)
    marks = Marks()
    units = [pausing_unit(kit, i, rng.uniform(0.1, 0.3), marks) for i in range(UNITS)]
    with anyio.fail_after(60):
        with anyio.CancelScope() as outside:
            async with anyio.create_task_group() as group:
                group.start_soon(runner.run, units)
                group.start_soon(cancel_mid_unit, outside, marks)
    returned = time.monotonic()
    assert kit.pool.checkedout() == 0, "connections are back when the cancellation propagates"
    assert runner.in_flight == 0
    cut = marks.started - marks.finished
    assert cut, "the cancellation came while units were between their two rows"

    holding = await anyio.to_thread.run_sync(holding_transactions, kit.db, server.ids)
    at_return = list(holding)
    while holding and time.monotonic() - returned < PROMISE_S:
        await anyio.sleep(0.02)
        holding = await anyio.to_thread.run_sync(holding_transactions, kit.db, server.ids)
    rows = kit.db.rows_per_unit()
    print(
        f"returned {returned - marks.cancelled_at:.3f} s after the cancellation; units cut in flight: "
        f"{len(cut)}, committed: {len(rows)}; in a transaction at return: {at_return}"
    )
    assert holding == [], f"{PROMISE_S} s after the cancelled run returned, still in a transaction: {holding}"
    if isinstance(kit.db, MariaDB):
        # The runner waits for the server to end the connections it discarded (KILL CONNECTION): not
        # one is left running the cancelled unit's statement, with its transaction, when the run returns.
        assert at_return == [], f"in a transaction when the cancelled run returned: {at_return}"

    assert all(count == 2 for count in rows.values()), f"half-written units: {rows}"

    # The runner is still usable: the next run is correct.
    report = await runner.run([pausing_unit(kit, UNITS + i, 0.0, marks) for i in range(10)])
    assert report.values() == [UNITS + i for i in range(10)]
    assert kit.pool.checkedout() == 0
    rows = kit.db.rows_per_unit()
    assert all(rows[UNITS + i] == 2 for i in range(10))
    assert all(count == 2 for count in rows.values()), f"half-written units: {rows}"
