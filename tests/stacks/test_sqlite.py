"""The runner contract where it holds on SQLite: aiosqlite for the async runners, pysqlite for threads.

SQLite allows one writer at a time, so the tests that write use limit=1; reads run a few at once.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import Pool

from boundeddb import ChunkedRunner, Outcome, RunFailed, SemaphoreRunner, ThreadOffloadRunner, UnitTimeout
from tests.support.kits import Boom, scalar_unit
from tests.support.models import Item

CASES = [("semaphore", "asyncio"), ("chunked", "asyncio"), ("threads", "asyncio"), ("threads", "trio")]
CASE_IDS = [f"{kind}-{backend}" for kind, backend in CASES]

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize(("kind", "anyio_backend"), CASES, ids=CASE_IDS),
]


class SqliteKit:
    """A runner over the test's SQLite file, and units of the shape that runner takes."""

    def __init__(self, kind: str, sessions: Any) -> None:
        self.kind = kind
        self.is_async = kind != "threads"
        self.sessions = sessions

    def runner(self, limit: int, **options: Any) -> Any:
        if self.kind == "semaphore":
            return SemaphoreRunner(self.sessions, limit=limit, **options)
        if self.kind == "chunked":
            return ChunkedRunner(self.sessions, chunk_size=limit, **options)
        return ThreadOffloadRunner(self.sessions, limit=limit, **options)

    @property
    def pool(self) -> Pool:
        bind = self.sessions.kw["bind"]
        pool: Pool = bind.sync_engine.pool if self.is_async else bind.pool
        return pool

    def insert(self, i: int, *, fail: bool = False) -> Callable[[Any], Any]:
        if self.is_async:

            async def unit(session: AsyncSession) -> int:
                session.add(Item(key=f"k{i}", unit=i))
                await session.flush()
                if fail:
                    raise Boom(i)
                return i

            return unit

        def sync_unit(session: Session) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            session.flush()
            if fail:
                raise Boom(i)
            return i

        return sync_unit

    def select(self, value: int) -> Callable[[Any], Any]:
        return scalar_unit(self.is_async, text("SELECT CAST(:v AS INTEGER) * 2"), {"v": value})

    def map_fn(self) -> Callable[..., Any]:
        query = text("SELECT CAST(:v AS INTEGER) + 100")
        if self.is_async:

            async def fn(session: AsyncSession, item: int) -> int:
                return int((await session.execute(query, {"v": item})).scalar_one())

            return fn

        def sync_fn(session: Session, item: int) -> int:
            return int(session.execute(query, {"v": item}).scalar_one())

        return sync_fn


@pytest.fixture
def kit(kind: str, request: pytest.FixtureRequest) -> SqliteKit:
    # sqlite_async is an asyncio fixture (aiosqlite): ask for it only where it is needed.
    fixture = "sqlite_sync" if kind == "threads" else "sqlite_async"
    return SqliteKit(kind, request.getfixturevalue(fixture))


def committed(sqlite_path: Path) -> list[int]:
    """The units whose rows are in the file, read with the standard library's own connection."""
    with closing(sqlite3.connect(sqlite_path)) as connection:
        return [row[0] for row in connection.execute("SELECT unit FROM items ORDER BY unit")]


def assert_no_leaks(kit: SqliteKit) -> None:
    assert kit.pool.checkedout() == 0


async def test_values_come_back_in_input_order(kit: SqliteKit) -> None:
    """Reads, a few at once, come back in input order with their stats."""
    report = await kit.runner(limit=3).run(kit.select(i) for i in range(60))
    assert report.values() == [2 * i for i in range(60)]
    assert [o.index for o in report.outcomes] == list(range(60))
    assert report.stats.submitted == report.stats.succeeded == 60
    assert 1 <= report.stats.peak_in_flight <= 3
    assert 1 <= report.stats.peak_connections <= 3
    assert_no_leaks(kit)


async def test_map_runs_fn_for_every_item(kit: SqliteKit) -> None:
    """map(fn, items) runs fn(session, item) for every item, in item order."""
    report = await kit.runner(limit=2).map(kit.map_fn(), range(25))
    assert report.values() == [i + 100 for i in range(25)]
    assert_no_leaks(kit)


async def test_commit_on_success_rollback_on_failure(kit: SqliteKit, sqlite_path: Path) -> None:
    """errors="collect": failed units leave no row, and every neighbour's row is there."""
    failing = {3, 7, 8, 19}
    report = await kit.runner(limit=1, errors="collect").run(
        kit.insert(i, fail=i in failing) for i in range(20)
    )
    assert committed(sqlite_path) == [i for i in range(20) if i not in failing]
    assert {o.index for o in report.failures} == failing
    assert all(isinstance(o.error, Boom) and o.error.args == (o.index,) for o in report.failures)
    assert (report.stats.succeeded, report.stats.failed) == (16, 4)
    assert_no_leaks(kit)


async def test_errors_raise_report_matches_the_table(kit: SqliteKit, sqlite_path: Path) -> None:
    """errors="raise": RunFailed after unit 10; its report and the table agree on what committed."""
    with pytest.raises(RunFailed) as caught:
        await kit.runner(limit=1).run(kit.insert(i, fail=i == 10) for i in range(50))
    report = caught.value.report
    assert report.stats.submitted == 11, "with limit=1 nothing else was in flight"
    assert [o.index for o in report.outcomes] == list(range(11))
    assert committed(sqlite_path) == [o.index for o in report.outcomes if o.ok] == list(range(10))
    assert [type(e) for e in caught.value.exceptions] == [Boom]
    assert caught.value.exceptions[0] is report.outcomes[10].error
    assert_no_leaks(kit)


async def test_stream_yields_every_outcome(kit: SqliteKit, sqlite_path: Path) -> None:
    """stream() yields one outcome per unit, and their rows are committed."""
    seen: list[Outcome[int]] = [o async for o in kit.runner(limit=1).stream(kit.insert(i) for i in range(15))]
    assert sorted(o.index for o in seen) == list(range(15))
    assert all(o.ok for o in seen)
    assert committed(sqlite_path) == list(range(15))
    assert_no_leaks(kit)


async def test_submit_returns_the_value_or_raises_the_units_own_error(
    kit: SqliteKit, sqlite_path: Path
) -> None:
    """submit() returns the value and commits, or raises the unit's exception and rolls back."""
    runner = kit.runner(limit=1)
    assert await runner.submit(kit.insert(1)) == 1
    with pytest.raises(Boom):
        await runner.submit(kit.insert(2, fail=True))
    assert committed(sqlite_path) == [1]
    assert_no_leaks(kit)


async def test_a_unit_over_its_timeout_is_rolled_back(kit: SqliteKit, sqlite_path: Path) -> None:
    """A unit that outlasts timeout= fails with UnitTimeout and its row is rolled back, neighbours kept."""
    # There is no server to stop a statement: the async runners cancel the unit; the thread runner
    # lets it run to its end (it cannot kill a thread), then rolls it back.
    if kit.is_async:

        async def slow(session: AsyncSession) -> int:
            session.add(Item(key="slow", unit=1))
            await session.flush()
            await anyio.sleep(30)  # cancelled by the runner's timeout
            return 1  # pragma: no cover

    else:

        def slow(session: Session) -> int:  # type: ignore[misc]
            session.add(Item(key="slow", unit=1))
            session.flush()
            time.sleep(2.0)  # the unit's own slow work, outlasting timeout=0.5
            return 1

    # The timeout holds for the neighbours too: 0.5 s leaves a loaded machine room for their
    # first connect and commit (0.1 s once timed out unit 0 under CI load).
    runner = kit.runner(limit=1, errors="collect", timeout=0.5)
    with anyio.fail_after(20):
        report = await runner.run([kit.insert(0), slow, kit.insert(2)])
    assert [o.ok for o in report.outcomes] == [True, False, True], [o.error for o in report.outcomes]
    error = report.outcomes[1].error
    assert isinstance(error, UnitTimeout)
    assert (error.index, error.timeout) == (1, 0.5)
    assert committed(sqlite_path) == [0, 2]
    assert_no_leaks(kit)
