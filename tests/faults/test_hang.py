"""A hanging unit: a statement stuck on the server (pg_sleep), stopped by timeout=."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from boundeddb import UnitTimeout
from tests.support.faults import active_queries, assert_no_open_transactions, codes_of, wait_until
from tests.support.kits import Kit

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


HANG_CASES = [
    ("semaphore", "asyncio"),
    ("chunked", "asyncio"),
    ("semaphore-psycopg", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg", "trio"),
    ("threads-psycopg2", "asyncio"),
]
HANG_IDS = [f"{kind}-{backend}" for kind, backend in HANG_CASES]


def hanging(kit: Kit) -> Any:
    """A unit that would sit in pg_sleep(60) on the server."""
    if kit.is_async:

        async def unit(session: AsyncSession) -> None:
            await session.execute(text("SELECT pg_sleep(60)"))

        return unit

    def sync_unit(session: Session) -> None:
        session.execute(text("SELECT pg_sleep(60)"))

    return sync_unit


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "anyio_backend"), HANG_CASES, ids=HANG_IDS)
async def test_a_hanging_unit_times_out_and_its_statement_stops_on_the_server(
    kit: Kit, admin: Engine, app_name: str
) -> None:
    """pg_sleep(60) with timeout=0.5: UnitTimeout fast, the query leaves the server, the slot is free."""
    runner = kit.runner(limit=1, timeout=0.5)
    started = time.monotonic()
    with anyio.fail_after(30), pytest.raises(UnitTimeout) as caught:
        await runner.submit(hanging(kit))
    elapsed = time.monotonic() - started
    assert elapsed < 5, f"UnitTimeout after {elapsed:.1f} s"
    assert caught.value.index == 0
    assert caught.value.timeout == 0.5
    if not kit.is_async:  # the server stopped it: statement_timeout's query_canceled is the cause
        assert codes_of(caught.value.__cause__) == "57014"
    wait_until(
        lambda: active_queries(admin, app_name, "%pg_sleep(60)%") == 0,
        10,
        "the timed-out pg_sleep(60) left pg_stat_activity",
    )
    assert runner.in_flight == 0
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after the timeout")
    # The slot is free: with limit=1 the next unit runs at once.
    with anyio.fail_after(5):
        assert await runner.submit(kit.select(7)) == 7
    # The same in a run: the timeout is that unit's outcome, its neighbours commit.
    runner = kit.runner(limit=1, timeout=0.5, errors="collect")
    with anyio.fail_after(30):
        report = await runner.run([kit.select(1), hanging(kit), kit.select(3)])
    assert [o.ok for o in report.outcomes] == [True, False, True]
    assert isinstance(report.outcomes[1].error, UnitTimeout)
    assert not report.outcomes[1].commit_unknown
    assert kit.pool.checkedout() == 0
