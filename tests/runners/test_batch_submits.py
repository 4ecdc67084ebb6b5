"""
``batch=`` and ``submit()``: concurrent submits share transactions, each returns (or raises) its own
unit's result only once its batch committed, ``priority > 0`` is never held by ``linger``, and closing
the runner runs the batches that linger.

On PostgreSQL, MariaDB and SQLite, for every runner (tests/support/batches.py). The time bounds are
generous (half the linger or more): they tell "held for the whole linger" from "not held", nothing finer.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.to_thread
import pytest

from boundeddb import BatchPolicy, RunnerClosedError
from tests.support.batches import (  # noqa: F401 -- the *_fixture names are fixtures pytest finds here
    ALL_CASES,
    ONE_OF_EACH,
    SERVER_CASES,
    BatchKit,
    assert_no_leaks,
    bkit_fixture,
    every,
    make_sqlite_async_engine_fixture,
    make_sqlite_sync_engine_fixture,
    sqlite_file_fixture,
)
from tests.support.faults import wait_until
from tests.support.kits import StartGate

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("collect_garbage")]

#: A linger far longer than any test may wait for it.
LONG_LINGER = 5.0
#: What "not held by the linger" means here: well under LONG_LINGER, however busy the machine.
PROMPT = LONG_LINGER / 2


@every(ONE_OF_EACH)
async def test_a_storm_of_submits_shares_transactions_and_each_returns_once_committed(bkit: BatchKit) -> None:
    """100 concurrent submits: few COMMITs; each returns its value once its row is visible elsewhere."""
    n, failing = 100, 37
    runner = bkit.runner(limit=4, batch=BatchPolicy(size=50, linger=0.05))
    values: dict[int, int] = {}
    seen: dict[int, int] = {}
    errors: dict[int, BaseException] = {}

    async def request(i: int) -> None:
        try:
            values[i] = await runner.submit(bkit.raising(i) if i == failing else bkit.good(i))
        except ValueError as error:
            errors[i] = error
            return
        # Right away, from another connection, before this task gives the event loop back.
        seen[i] = bkit.visible(i)  # blocking on purpose: no other task runs meanwhile

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for i in range(n):
                group.start_soon(request, i)
    good = [i for i in range(n) if i != failing]
    assert values == {i: 10 * i for i in good}
    assert seen == dict.fromkeys(good, 1), "a submit returned before its row was committed"
    assert list(errors) == [failing]
    assert errors[failing].args == (failing,), "the failing submit raises its own exception"
    assert bkit.rows() == dict.fromkeys(good, 1)
    assert bkit.commits.n <= n / 5, f"{bkit.commits.n} COMMITs for {n} submits: they did not share"
    statistics = runner.statistics()
    assert 0 < statistics.batches_committed <= bkit.commits.n
    assert statistics.units_rerun > 0, "the failing unit's batch ran again without it"
    assert_no_leaks(bkit)


@every(ONE_OF_EACH)
async def test_a_priority_submit_is_not_held_by_the_linger(bkit: BatchKit) -> None:
    """With linger=5 s, submit(priority=1) returns long before 5 s; aclose() then runs the lingering one."""
    runner = bkit.runner(limit=4, batch=BatchPolicy(size=50, linger=LONG_LINGER))
    lingering: list[int] = []

    async def background() -> None:
        lingering.append(await runner.submit(bkit.good(0)))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(background)
            await anyio.wait_all_tasks_blocked()  # the priority-0 submit waits in its batch
            started = time.monotonic()
            assert await runner.submit(bkit.good(1), priority=1) == 10
            took = time.monotonic() - started
            assert bkit.visible(1) == 1
            closing = time.monotonic()
            await runner.aclose()
        closed_in = time.monotonic() - closing
    assert took < PROMPT, f"submit(priority=1) took {took:.2f} s: held by the {LONG_LINGER} s linger"
    assert lingering == [0]
    assert closed_in < PROMPT, f"the lingering submit returned {closed_in:.2f} s after aclose()"
    assert bkit.rows() == {0: 1, 1: 1}
    assert_no_leaks(bkit)


@every(ONE_OF_EACH)
async def test_leaving_the_runner_runs_the_submits_that_linger(bkit: BatchKit) -> None:
    """Submits waiting in a 5 s linger when `async with runner` exits run at once: none is lost."""
    n = 20
    runner = bkit.runner(limit=4, batch=BatchPolicy(size=50, linger=LONG_LINGER))
    values: dict[int, int] = {}

    async def request(i: int) -> None:
        values[i] = await runner.submit(bkit.good(i))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group, runner:
            for i in range(n):
                group.start_soon(request, i)
            await anyio.wait_all_tasks_blocked()  # every submit waits in the lingering batch
            executed = sum(bkit.executions.values())
            assert executed == 0, f"{executed} units ran before a batch that is not full lingered out"
            closing = time.monotonic()
        closed_in = time.monotonic() - closing
    assert closed_in < PROMPT, f"the lingering submits returned {closed_in:.2f} s after the runner closed"
    assert values == {i: 10 * i for i in range(n)}
    assert bkit.rows() == dict.fromkeys(range(n), 1)
    assert bkit.commits.n <= 2, f"{bkit.commits.n} COMMITs for {n} submits in one lingering batch"
    with pytest.raises(RunnerClosedError):
        await runner.submit(bkit.good(n))
    assert_no_leaks(bkit)


@every([case for case in ALL_CASES if case[0].startswith("threads")])
async def test_the_thread_runners_sync_close_runs_the_submits_that_linger(bkit: BatchKit) -> None:
    """ThreadOffloadRunner.close() (sync) while submits wait in a 5 s linger: they run at once, none lost."""
    n = 5
    runner = bkit.runner(limit=4, batch=BatchPolicy(size=50, linger=LONG_LINGER))
    values: dict[int, int] = {}

    async def request(i: int) -> None:
        values[i] = await runner.submit(bkit.good(i))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for i in range(n):
                group.start_soon(request, i)
            await anyio.wait_all_tasks_blocked()
            closing = time.monotonic()
            runner.close()
        closed_in = time.monotonic() - closing
    assert closed_in < PROMPT, f"the lingering submits returned {closed_in:.2f} s after close()"
    assert values == {i: 10 * i for i in range(n)}
    assert bkit.rows() == dict.fromkeys(range(n), 1)


# -- a caller that gives up --------------------------------------------------------------------------------


@every()
async def test_a_submit_cancelled_while_it_lingers_leaves_its_batch_mates_alone(bkit: BatchKit) -> None:
    """Of 10 submits lingering in one batch, one whose caller gives up: the 9 others commit, it does not."""
    n, quitter = 10, 4
    runner = bkit.runner(limit=4, batch=BatchPolicy(size=50, linger=LONG_LINGER))
    values: dict[int, int] = {}
    scopes: dict[int, anyio.CancelScope] = {}

    async def request(i: int) -> None:
        with anyio.CancelScope() as scopes[i]:
            values[i] = await runner.submit(bkit.good(i))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group, runner:
            for i in range(n):
                group.start_soon(request, i)
            await anyio.wait_all_tasks_blocked()  # all ten wait in the lingering batch
            scopes[quitter].cancel()
            await anyio.wait_all_tasks_blocked()
        # Leaving the runner ran the batch without waiting out the linger.
    others = [i for i in range(n) if i != quitter]
    assert values == {i: 10 * i for i in others}
    assert bkit.rows() == dict.fromkeys(others, 1)
    assert_no_leaks(bkit)


#: The server sleep of the unit whose caller gives up, and how soon after that the others must return.
#: The quitter's unit sleeps this long on the server: its statement runs to its end (see gather.py).
QUITTER_SLEEP = 1.0


@every(SERVER_CASES)
async def test_a_submit_cancelled_mid_batch_is_rolled_back_and_its_batch_mates_commit(bkit: BatchKit) -> None:
    """A caller gives up while its unit sleeps in a shared batch: its unit never commits, the others do."""
    n, quitter = 10, 4
    runner = bkit.runner(limit=4, batch=BatchPolicy(size=50, linger=0.05))
    gate = StartGate(1)
    values: dict[int, int] = {}
    scopes: dict[int, anyio.CancelScope] = {}

    def unit(i: int) -> Any:
        if i != quitter:
            return bkit.good(i)
        started = ("call", lambda: gate.arrive(from_thread=not bkit.is_async))
        sleep = ("sql", bkit.db.sleep, {"s": QUITTER_SLEEP})
        return bkit.unit(i, ("add", f"k{i}", i), ("flush",), started, sleep)

    async def request(i: int) -> None:
        with anyio.CancelScope() as scopes[i]:
            values[i] = await runner.submit(unit(i))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for i in range(n):
                group.start_soon(request, i)
            await gate.event.wait()
            await anyio.to_thread.run_sync(wait_until, lambda: bkit.db.sleeping() == 1, 10, "the unit asleep")
            scopes[quitter].cancel()
    others = [i for i in range(n) if i != quitter]
    assert scopes[quitter].cancelled_caught
    assert bkit.rows() == dict.fromkeys(others, 1), "the unit of a caller who gave up was committed"
    assert values == {i: 10 * i for i in others}
    assert_no_leaks(bkit)
