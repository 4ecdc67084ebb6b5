"""Killed backends: pg_terminate_backend on the runner's backends, again and again, mid-run."""

from __future__ import annotations

import anyio
import pytest
from sqlalchemy.engine import Engine

from boundeddb import RetryPolicy
from tests.support.faults import (
    STALL_S,
    Killer,
    Progress,
    assert_no_open_transactions,
    check_commit_invariant,
    deadline_per_unit,
    inserting,
    unexpected_failures,
)
from tests.support.kits import Kit
from tests.support.probes import committed_units
from tests.support.soak import quick_or_long

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


#: Inserts under kills (in a soak, the long version).
KILL_UNITS = quick_or_long(2500, 5000)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize(
    ("kind", "anyio_backend"),
    [("semaphore", "asyncio"), ("threads-psycopg", "asyncio")],
    ids=["semaphore-asyncio", "threads-psycopg-asyncio"],
)
async def test_killed_backends_are_retried_and_never_commit_twice(
    kit: Kit, admin: Engine, app_name: str
) -> None:
    """Inserts while their backends are terminated: no hang, no leak, every row accounted for."""
    runner = kit.runner(limit=10, errors="collect", retry=RetryPolicy(attempts=10, initial_delay=0.01))
    progress = Progress()
    killer = Killer(
        admin, app_name, progress, start_at=KILL_UNITS // 10, stop_at=KILL_UNITS * 9 // 10, every=10
    )
    with anyio.fail_after(STALL_S) as deadline, killer:
        units = (inserting(kit.is_async, i, progress) for i in range(KILL_UNITS))
        report = await runner.run(units, on_outcome=deadline_per_unit(deadline))
    outcomes = report.outcomes
    print(
        f"terminated={killer.terminated} rounds={killer.rounds} retried={report.stats.retried} "
        f"failed={report.stats.failed} commit_unknown={sum(o.commit_unknown for o in outcomes)} "
        f"elapsed={report.stats.elapsed_s:.1f}s"
    )
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after the kills")
    check_commit_invariant(outcomes, committed_units(admin), KILL_UNITS)
    assert report.stats.peak_connections <= runner.limit
    assert killer.terminated > 0
    assert report.stats.retried > 0
    assert unexpected_failures(outcomes) == []
