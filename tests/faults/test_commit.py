"""A failed COMMIT or ROLLBACK: the engine's commit/rollback raises before it reaches the server."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import anyio
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.faults import SMALL_CASES, SMALL_IDS, assert_no_open_transactions
from tests.support.kits import Boom, Kit

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


class InjectedFailure(Exception):
    """Stands in for a COMMIT or ROLLBACK that failed on the client side (say, a cancel request hit it)."""


def fail_next(engine: Any, event_name: str) -> list[int]:
    """Make the engine's next ``commit``/``rollback`` raise before it reaches the server; count them."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    raised: list[int] = []

    def once(*_: Any) -> None:
        if not raised:
            raised.append(1)
            raise InjectedFailure(event_name)

    event.listen(sync_engine, event_name, once)
    return raised


@pytest.mark.anyio
@pytest.mark.usefixtures("reap_backends")
@pytest.mark.parametrize(("kind", "anyio_backend"), SMALL_CASES, ids=SMALL_IDS)
async def test_a_failed_commit_returns_a_clean_connection(kit: Kit, admin: Engine, app_name: str) -> None:
    """A COMMIT that fails before it reaches the server: the unit fails, its transaction does not linger."""
    # This is what a cancel request that lands just as COMMIT starts does for real (test_cancellation.py's
    # test_cancelling_at_random_points_leaks_nothing finds it now and then): the server aborts the
    # transaction and keeps it open until a ROLLBACK.
    runner = kit.runner(limit=1, errors="collect")
    assert await runner.submit(kit.select(0)) == 0  # connect first: the dialect's set-up rolls back too
    raised = fail_next(kit.engine, "commit")
    report = await runner.run([kit.select(1)])
    assert raised == [1]
    assert isinstance(report.outcomes[0].error, InjectedFailure)
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after a failed COMMIT")
    # The next unit on the same (only) connection starts in a fresh transaction.
    assert await runner.submit(kit.select(2)) == 2


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "reap_backends")
@pytest.mark.parametrize(("kind", "anyio_backend"), SMALL_CASES, ids=SMALL_IDS)
async def test_a_failed_rollback_still_returns_the_connection(kit: Kit, admin: Engine, app_name: str) -> None:
    """If closing a unit's session fails (its ROLLBACK raised), the connection is still given back."""
    runner = kit.runner(limit=1, errors="collect")
    assert await runner.submit(kit.select(0)) == 0  # connect first: the dialect's set-up rolls back too
    raised = fail_next(kit.engine, "rollback")
    report = await runner.run([kit.insert(1, fail=True)])
    failed_with = type(report.outcomes[0].error)
    leaked = kit.pool.checkedout()
    del report  # its Boom's traceback holds the unit's frames, and so the unit's transaction
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()  # a connection dropped on the floor is closed only by GC, with a warning
    assert raised == [1]
    assert failed_with is Boom
    assert leaked == 0, "the unit's connection was neither returned to the pool nor invalidated"
    assert [str(warning.message) for warning in caught] == []
    assert_no_open_transactions(admin, app_name, "after a failed ROLLBACK")
    with anyio.fail_after(10):
        assert await runner.submit(kit.select(2)) == 2
