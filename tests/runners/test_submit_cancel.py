"""
A cancelled ``submit()`` commits only where its ``on_outcome`` hook says so.

The contract ("On cancellation" in docs/explanation/guarantees.md): a cancelled ``submit()`` whose
hook was not called did not commit and never will; where the hook was called, its outcome is what
the server did. A call cancelled before its COMMIT began withdraws its unit; once its COMMIT began,
the call waits for the outcome, tells the hook, and raises the cancellation.

With ``batch=`` (calls share transactions, ``_core/gather.py``) and without, on every runner on
PostgreSQL (tests/support/batches.py), cancelled by a cancel scope and by ``Task.cancel()``. A
deferred constraint trigger that sleeps holds a COMMIT open, so that a cancellation lands inside it.
The races run a quick seeded sample in the suite and the long one in ``nox -s soak``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from boundeddb import BatchPolicy, Outcome, RetryPolicy, is_transient
from tests.runners.test_verify_commits import (  # noqa: F401 -- cutter, proxied: fixtures pytest finds here
    CommitCutter,
    ProxiedRunners,
    adding_only,
    cutter,
    proxied,
)
from tests.support.batches import (  # noqa: F401 -- the *_fixture names are fixtures pytest finds here
    PG_CASES,
    SERVER_CASES,
    BatchKit,
    assert_no_leaks,
    bkit_fixture,
    every,
    make_sqlite_async_engine_fixture,
    make_sqlite_sync_engine_fixture,
    sqlite_file_fixture,
)
from tests.support.faults import Countdown, slow_commits, wait_until
from tests.support.kits import StartGate
from tests.support.probes import committed_units
from tests.support.soak import quick_or_long, soak_seed

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("collect_garbage")]

#: A linger far longer than any test waits for it: a batch starts once it is full, or the runner closes.
LONG_LINGER = 5.0


class Caller:
    """One ``submit()`` that the test may cancel: by a cancel scope, or by ``Task.cancel()`` (asyncio)."""

    def __init__(self, runner: Any, unit: Any, how: str = "scope") -> None:
        #: What the call's own on_outcome hook was told.
        self.heard: list[Outcome[Any]] = []
        self.value: Any = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.done = anyio.Event()
        self._scope = anyio.CancelScope()
        self._task: asyncio.Task[Any] | None = None
        submitting = runner.submit(unit, on_outcome=self.heard.append)
        if how == "task":  # a task of its own, as asyncio.timeout() or a server's request task
            self._task = asyncio.ensure_future(submitting)
        else:
            self._submitting = submitting

    async def run(self) -> None:
        """Await the call and record how it ended."""
        try:
            if self._task is not None:
                await asyncio.wait({self._task})
                if self._task.cancelled():
                    self.cancelled = True
                elif (error := self._task.exception()) is not None:
                    self.error = error
                else:
                    self.value = self._task.result()
            else:
                with self._scope:
                    try:
                        self.value = await self._submitting
                    except Exception as error:
                        self.error = error
                self.cancelled = self._scope.cancelled_caught
        finally:
            self.done.set()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        else:
            self._scope.cancel()

    def check(self, rows: int, what: str) -> None:
        """The contract for this call, whose unit committed ``rows`` rows."""
        assert len(self.heard) <= 1, f"{what}: the hook was told {len(self.heard)} times"
        if not self.cancelled:  # it returned, or raised the unit's own error: told as any call is
            assert len(self.heard) == 1, f"{what}: not cancelled, yet the hook was not called"
        if not self.heard:
            assert rows == 0, f"{what}: cancelled, its hook never called, and its row committed"
            return
        outcome = self.heard[0]
        if outcome.commit_unknown:
            assert rows <= 1, f"{what}: commit_unknown, and {rows} rows"
        else:
            assert rows == int(outcome.ok), f"{what}: the hook was told ok={outcome.ok}, and {rows} rows"


def how_params(cases: list[tuple[str, str]], *, twice: bool = False) -> list[Any]:
    """
    ``(case, backend, how)``: each case by a cancel scope, and under asyncio by ``Task.cancel()``
    too, and with ``twice``, by two of them.
    """
    native = ["task", "task-twice"] if twice else ["task"]
    return [
        pytest.param(case, backend, how, id=f"{case}-{backend}-{how}", marks=[pytest.mark.postgres])
        for case, backend in cases
        for how in (["scope", *native] if backend == "asyncio" else ["scope"])
    ]


class Moments:
    """Where a test's cancellations wait: units started, units returned, COMMITs begun (from any thread)."""

    def __init__(self, bkit: BatchKit, engine: Any) -> None:
        self._from_thread = not bkit.is_async
        self.started = self.returned = self.commits = Countdown(0, from_thread=self._from_thread)
        #: Called in the thread that commits, after the batch's check for withdrawn units, before its COMMIT.
        self.at_commit: Callable[[], None] | None = None
        event.listen(getattr(engine, "sync_engine", engine), "commit", self._on_commit)
        self._engine = engine

    def arm(self, started: int, returned: int, commits: int) -> None:
        self.started = Countdown(started, from_thread=self._from_thread)
        self.returned = Countdown(returned, from_thread=self._from_thread)
        self.commits = Countdown(commits, from_thread=self._from_thread)
        self.at_commit = None

    def _on_commit(self, _connection: Any) -> None:
        self.commits.arrive()  # before the COMMIT goes out (SQLAlchemy's commit event)
        at_commit, self.at_commit = self.at_commit, None
        if at_commit is not None:
            at_commit()

    def close(self) -> None:
        event.remove(getattr(self._engine, "sync_engine", self._engine), "commit", self._on_commit)


async def first_of(*events: anyio.Event) -> None:
    """Wait until one of ``events`` is set."""
    async with anyio.create_task_group() as group:

        async def wait(event_: anyio.Event) -> None:
            await event_.wait()
            group.cancel_scope.cancel()

        for event_ in events:
            group.start_soon(wait, event_)


# -- a batch's leader and follower, cancelled in turn ---------------------------------------------------


@every(SERVER_CASES)
async def test_a_cancelled_follower_then_its_cancelled_leader_leave_only_the_waiting_callers_row(
    bkit: BatchKit,
) -> None:
    """B's submit() is cancelled, then its batch's leader A's: only C, whose caller waits, commits."""
    runner = bkit.runner(limit=2, batch=BatchPolicy(size=3, linger=LONG_LINGER))
    gate = StartGate(1)
    asleep = ("call", lambda: gate.arrive(from_thread=not bkit.is_async))
    units = [
        bkit.unit(0, ("add", "k0", 0), ("flush",), asleep, ("sql", bkit.db.sleep, {"s": 30})),
        bkit.good(1),
        bkit.good(2),
    ]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            a, b, c = callers = [Caller(runner, unit) for unit in units]
            for caller in callers:  # A queues first and leads; the batch starts once C fills it
                group.start_soon(caller.run)
                await anyio.wait_all_tasks_blocked()
            await gate.event.wait()
            await anyio.to_thread.run_sync(wait_until, lambda: bkit.db.sleeping() == 1, 10, "A's unit asleep")
            b.cancel()
            await b.done.wait()
            a.cancel()
            await a.done.wait()
            await runner.aclose()  # C leads the next batch: it starts now rather than after the linger
    assert (a.cancelled, b.cancelled, c.cancelled) == (True, True, False)
    assert a.heard == b.heard == []
    assert c.value == 20
    assert bkit.rows() == {2: 1}, "a withdrawn unit was put back in the queue and committed"
    assert_no_leaks(bkit)


@pytest.mark.parametrize(("case", "anyio_backend", "how"), how_params(PG_CASES, twice=True))
async def test_a_batch_cancelled_during_its_commit_tells_each_caller_it_committed(
    bkit: BatchKit, how: str
) -> None:
    """
    A follower's and the leader's submit() cancelled while their batch's COMMIT runs (``task-twice``:
    by two Task.cancel() each, the second while they wait): both hear ok, and raise the cancellation.
    """
    runner = bkit.runner(limit=2, batch=BatchPolicy(size=3, linger=LONG_LINGER))
    moments = Moments(bkit, bkit.engine)
    moments.arm(0, 0, 1)
    try:
        with slow_commits(bkit.admin(), 1.0), anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                a, b, c = callers = [
                    Caller(runner, bkit.good(i), how.removesuffix("-twice")) for i in range(3)
                ]
                for caller in callers:
                    group.start_soon(caller.run)
                    await anyio.wait_all_tasks_blocked()
                await moments.commits.event.wait()  # its COMMIT goes out, and the trigger holds it 1 s
                b.cancel()
                a.cancel()
                if how.endswith("twice"):
                    await anyio.wait_all_tasks_blocked()
                    b.cancel()
                    a.cancel()
    finally:
        moments.close()
    assert (a.cancelled, b.cancelled, c.cancelled) == (True, True, False)
    assert [(o.ok, o.value) for caller in callers for o in caller.heard] == [
        (True, 0),
        (True, 10),
        (True, 20),
    ]
    assert bkit.rows() == dict.fromkeys(range(3), 1)
    assert bkit.commits.n == 1
    assert_no_leaks(bkit)


# -- a lone submit(), without batch= ----------------------------------------------------------------------


def _transient_once(bkit: BatchKit, i: int) -> Any:
    """Adds row ``i``; its first execution then fails with a serialization failure (retried)."""
    return bkit.unit(i, ("add", f"k{i}", i), ("flush",), ("transient_once", i))


@pytest.mark.parametrize("when", ["statement", "commit", "retried-commit"])
@pytest.mark.parametrize(("case", "anyio_backend", "how"), how_params(PG_CASES, twice=True))
async def test_a_lone_submit_cancelled_during_its_commit_hears_it_and_one_cancelled_before_never_commits(
    bkit: BatchKit, how: str, when: str
) -> None:
    """
    Without batch=: cancelled while its unit's statement runs, no hook and no row; cancelled while
    its COMMIT runs (also the COMMIT of a retried attempt), the hook hears ok and the row is there.
    ``task-twice``: a second Task.cancel() while the call winds down changes neither.
    """
    retry = RetryPolicy(attempts=3, initial_delay=0, jitter=False, retry_on=is_transient)
    runner = bkit.runner(limit=2, retry=retry)
    moments = Moments(bkit, bkit.engine)
    moments.arm(0, 0, 1)
    if when == "statement":
        unit = bkit.sleeper(0, 30)
    else:
        unit = bkit.good(0) if when == "commit" else _transient_once(bkit, 0)
    try:
        with slow_commits(bkit.admin(), 1.0), anyio.fail_after(30):
            caller = Caller(runner, unit, how.removesuffix("-twice"))
            async with anyio.create_task_group() as group:
                group.start_soon(caller.run)
                if when == "statement":
                    asleep = lambda: bkit.db.sleeping() == 1  # noqa: E731
                    await anyio.to_thread.run_sync(wait_until, asleep, 10, "the unit asleep")
                else:
                    await moments.commits.event.wait()  # its COMMIT goes out, and the trigger holds it 1 s
                caller.cancel()
                if how.endswith("twice"):
                    await anyio.wait_all_tasks_blocked()
                    caller.cancel()
    finally:
        moments.close()
    assert caller.cancelled
    if when == "statement":
        assert caller.heard == []
        assert bkit.rows() == {}
    else:
        assert [(o.ok, o.value, o.attempts) for o in caller.heard] == [
            (True, 0, 1 if when == "commit" else 2)
        ]
        assert bkit.rows() == {0: 1}
    assert_no_leaks(bkit)


# -- verify_commits: a cancellation while the runner asks about a lost COMMIT ----------------------------


@pytest.mark.postgres
@pytest.mark.usefixtures("items_table", "reap_backends")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batch"])
@pytest.mark.parametrize(("kind", "driver"), [("semaphore", "asyncpg"), ("threads", "psycopg")])
async def test_a_submit_cancelled_while_its_lost_commit_is_asked_about_hears_commit_unknown(
    proxied: ProxiedRunners,  # noqa: F811 -- the fixture imported above
    cutter: CommitCutter,  # noqa: F811
    admin: Engine,
    kind: str,
    driver: str,
    batched: bool,
) -> None:
    """verify_commits: cancelled while the runner asks what became of its cut COMMIT: told commit_unknown."""
    batch = BatchPolicy(size=4, linger=0) if batched else None
    runner = proxied.runner(kind, driver, limit=2, batch=batch)
    cutter.arm(1, then_down=True)  # the COMMIT reaches the server; then nobody reaches the server
    with anyio.fail_after(30):
        caller = Caller(runner, adding_only(kind != "threads", 0))
        async with anyio.create_task_group() as group:
            group.start_soon(caller.run)
            await anyio.to_thread.run_sync(wait_until, lambda: cutter.refused > 0, 10, "the runner asking")
            caller.cancel()
    assert caller.cancelled
    assert [(o.ok, o.commit_unknown) for o in caller.heard] == [(False, True)]
    caller.check(len(committed_units(admin)), "the cancelled caller")
    assert proxied.pool().checkedout() == 0


# -- races at many seeds ---------------------------------------------------------------------------------


async def race_once(bkit: BatchKit, runner: Any, moments: Moments, seed: int, base: int, backend: str) -> str:
    """
    Submit callers whose units are numbered from ``base``, cancel some of them at a point drawn from
    ``seed``, and check each against the contract.

    The points: after some checkpoints; once some units started; once some units returned (a cancel
    between a unit's return and its batch's COMMIT); once some COMMIT began (inside it, when a slow
    commit holds it open).
    """
    rng = random.Random(seed)
    n = rng.randint(2, 10)
    how = rng.choice(["scope", "task"]) if backend == "asyncio" else "scope"
    moments.arm(rng.randint(1, n), rng.randint(1, n), rng.randint(1, 2))
    point = rng.choice(["checkpoints", "started", "returned", "returned", "commit"])
    steps: list[list[Any]] = []
    for i in range(n):
        unit = base + i
        these: list[Any] = [("call", moments.started.arrive), ("add", f"k{unit}", unit)]
        if rng.random() < 0.3:
            these += [("flush",), ("sql", bkit.db.sleep, {"s": rng.choice([0.0, 0.001, 0.005])})]
        if rng.random() < 0.1:
            these.append(("raise", lambda unit=unit: ValueError(unit)))
        these.append(("call", moments.returned.arrive))
        steps.append(these)
    callers = [Caller(runner, bkit.unit(base + i, *steps[i]), how) for i in range(n)]
    quitters = rng.sample(range(n), rng.randint(1, n))
    every_done = anyio.Event()

    async def call(caller: Caller) -> None:
        await caller.run()
        if all(c.done.is_set() for c in callers):
            every_done.set()

    async with anyio.create_task_group() as group:
        for caller in callers:
            group.start_soon(call, caller)
        if point == "checkpoints":
            for _ in range(rng.randint(0, 200)):
                await anyio.lowlevel.checkpoint()
        else:
            countdown = {"started": moments.started, "returned": moments.returned, "commit": moments.commits}[
                point
            ]
            await first_of(countdown.event, every_done)
            for _ in range(rng.randint(0, 30)):
                await anyio.lowlevel.checkpoint()
        for i in quitters:
            callers[i].cancel()
            for _ in range(rng.randint(0, 3)):
                await anyio.lowlevel.checkpoint()
    where = f"seed {seed}: {n} callers ({how}), {quitters} cancelled at {point}"
    rows = bkit.rows()
    for i, caller in enumerate(callers):
        caller.check(rows.get(base + i, 0), f"{where}: caller {i}")
    return where


#: Seeds per case: a fixed sample in the suite, the long version in a soak (other seeds each round).
RACE_SEEDS = quick_or_long(30, 300)
THREAD_RACE_SEEDS = quick_or_long(60, 600)


@pytest.mark.slow
@pytest.mark.timeout(600)
@every(PG_CASES)
async def test_batched_submits_cancelled_at_random_points_commit_only_where_their_hook_says(
    bkit: BatchKit, anyio_backend: str
) -> None:
    """Seeded races (leader, followers, between return and COMMIT, in a slow COMMIT): the contract holds."""
    runner = bkit.runner(limit=2, batch=BatchPolicy(size=4, linger=0.005))
    moments = Moments(bkit, bkit.engine)
    first = soak_seed(0)
    try:
        with slow_commits(bkit.admin(), 0.02, every=3):
            for round_, seed in enumerate(range(first, first + RACE_SEEDS)):
                with anyio.fail_after(30):
                    where = await race_once(bkit, runner, moments, seed, 100 * round_, anyio_backend)
                assert runner.in_flight == 0, where
    finally:
        moments.close()
    assert_no_leaks(bkit)


@pytest.mark.slow
@pytest.mark.timeout(600)
@every([case for case in PG_CASES if case[0].startswith("threads")])
async def test_a_thread_batch_cancelled_as_its_worker_thread_commits_tells_each_caller_what_happened(
    bkit: BatchKit, anyio_backend: str
) -> None:
    """
    Seeded cancels on the loop once a thread batch's last unit returned, while its worker thread
    flushes, checks for withdrawn units and commits: each unit withdrawn, or committed and heard.
    """
    size = 4
    runner = bkit.runner(limit=1, batch=BatchPolicy(size=size, linger=0.005))
    moments = Moments(bkit, bkit.engine)
    first = soak_seed(1000)
    try:
        for round_, seed in enumerate(range(first, first + THREAD_RACE_SEEDS)):
            with anyio.fail_after(30):
                where = await thread_race_once(bkit, runner, moments, seed, 100 * round_, size, anyio_backend)
            assert runner.in_flight == 0, where
    finally:
        moments.close()
    assert_no_leaks(bkit)


async def thread_race_once(
    bkit: BatchKit, runner: Any, moments: Moments, seed: int, base: int, size: int, backend: str
) -> str:
    """
    ``size`` callers in one batch; some cancelled once its last unit returned and some checkpoints
    passed, or while its worker thread is held between its check for withdrawn units and its COMMIT.
    """
    rng = random.Random(seed)
    how = rng.choice(["scope", "task"]) if backend == "asyncio" else "scope"
    moments.arm(size, size, 1)
    callers = [
        Caller(
            runner,
            bkit.unit(base + i, ("add", f"k{base + i}", base + i), ("call", moments.returned.arrive)),
            how,
        )
        for i in range(size)
    ]
    quitters = rng.sample(range(size), rng.randint(1, size))

    async def quit_() -> None:
        for i in quitters:
            callers[i].cancel()
        await anyio.wait_all_tasks_blocked()  # each has taken its unit back, or waits to hear of it

    checkpoints = rng.randint(0, 200)
    held = rng.random() < 0.25
    if held:  # the thread waits in the commit event, its check done, until the callers gave up
        moments.at_commit = lambda: anyio.from_thread.run(quit_)
    async with anyio.create_task_group() as group:
        for caller in callers:
            group.start_soon(caller.run)
        if not held:
            await moments.returned.event.wait()  # the worker thread goes on to flush, check and commit
            for _ in range(checkpoints):
                await anyio.lowlevel.checkpoint()
            await quit_()
    point = (
        "between the check and the COMMIT"
        if held
        else f"{checkpoints} checkpoints after the last unit returned"
    )
    where = f"seed {seed}: {quitters} cancelled ({how}) {point}"
    rows = bkit.rows()
    for i, caller in enumerate(callers):
        caller.check(rows.get(base + i, 0), f"{where}: caller {i}")
    return where
