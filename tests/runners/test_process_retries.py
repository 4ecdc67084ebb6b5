"""ProcessRunner on the real PostgreSQL: a unit retried at the end of a call's input settles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from boundeddb import ProcessRunner, RetryPolicy
from tests.support import process_units as units

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]

#: Seconds a call of a few units may take once its workers serve: a hang fails the test instead.
CALL_DEADLINE_S = 60.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("driver", "fn"), [("asyncpg", units.fail_once), ("psycopg", units.fail_once_sync)], ids=["async", "sync"]
)
@pytest.mark.parametrize("limit", [1, 2])
async def test_units_retried_after_the_last_was_handed_out_settle(
    rows: Engine, make_runner: Callable[..., ProcessRunner], driver: str, fn: Any, limit: int
) -> None:
    """
    Every unit's first attempt fails, transiently: each is retried and commits, and the call ends.

    The parent has no more units to hand the worker, and closes the call only once its units have
    settled: a retry must not wait for a slot held by the worker's runner waiting for more units.
    """
    async with make_runner(
        driver, limit=limit, processes=1, retry=RetryPolicy(attempts=3, initial_delay=0.01)
    ) as runner:
        with anyio.fail_after(CALL_DEADLINE_S):
            report = await runner.map(fn, range(limit))
    assert [value for value, _ in report.values()] == list(range(limit))
    assert [outcome.attempts for outcome in report.outcomes] == [2] * limit
    with rows.connect() as connection:
        found = connection.execute(text("SELECT unit FROM process_rows ORDER BY unit")).scalars().all()
    assert found == list(range(limit))
