"""The core's batches in memory: who fails a batch, and that every other unit commits exactly once.

The fake executor runs units ``async def unit(tx)`` against :class:`Store`, an in-memory database
whose transactions are dicts merged at COMMIT: a unit writes a key (a duplicate fails at once), a
key marked ``deferred`` fails only at COMMIT, naming no unit. Under trio a mock clock jumps, so
linger and back-offs take no real time.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import pytest
from trio.testing import MockClock

from boundeddb import BatchPolicy, RetryPolicy, RunFailed
from boundeddb._core.attempts import Attempts, CommitUnknown
from boundeddb._core.batches import Batches, BatchUnitFailed, BatchUnits
from boundeddb._core.gather import Gather
from boundeddb._core.limiter import Limiter, Slot
from boundeddb._core.pacing import SlidingWindow, Worker, drive
from boundeddb._core.recorder import Recorder
from boundeddb._core.run import Run
from boundeddb._core.sinks import CallbackSink, ListSink
from boundeddb._core.withdrawals import Withdrawals, Withdrawn
from boundeddb._outcome import Outcome, RunReport
from tests.support.fakes import FakeExecutor, NoPool

pytestmark = [pytest.mark.anyio]

Unit = Callable[["Tx"], Awaitable[Any]]


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    return "asyncio"


class Duplicate(Exception):
    """A key that is committed already, or written twice in one transaction."""


class Deferred(Exception):
    """A deferred check that failed at COMMIT: it names no unit."""


class Transient(Exception):
    """An error the retry policy retries."""


class Tx:
    """One transaction's writes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.writes: dict[str, int] = {}

    def write(self, key: str, value: int) -> None:
        if not key.startswith("late") and (key in self.store.rows or key in self.writes):
            raise Duplicate(key)
        self.writes[key] = value

    def flush(self) -> None:
        """Check the keys marked ``late``, as a flush would: a duplicate raises, naming no unit."""
        if any(key.startswith("late") and key in self.store.rows for key in self.writes):
            raise Duplicate("late")


class Store:
    """Committed rows, and the transactions that committed."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.commits = 0
        #: Raise this (once) at the next COMMIT.
        self.fail_next_commit: Exception | None = None

    def commit(self, tx: Tx) -> None:
        if (error := self.fail_next_commit) is not None:
            self.fail_next_commit = None
            raise error
        if any(key.startswith("deferred") for key in tx.writes):
            raise Deferred
        tx.flush()
        self.rows.update(tx.writes)
        self.commits += 1


class FakeBatchExecutor(FakeExecutor):
    """Runs ``async def unit(tx)``, one at a time or many in one transaction of :class:`Store`."""

    def __init__(self, attempts: Attempts, store: Store, policy: BatchPolicy) -> None:
        super().__init__(attempts)
        self.store = store
        self.executed: list[int] = []
        #: Seconds a batch's COMMIT takes once it began, and what is called as it begins.
        self.commit_seconds = 0.0
        self.committing: Callable[[], None] | None = None
        self.serve = Batches(  # type: ignore[method-assign]
            policy, attempts, self.attempt, self.attempt_batch, self.attempt_pinpointing
        ).serve

    async def attempt(self, worker: Worker, unit: Any, index: int) -> Any:
        tx = Tx(self.store)
        self.executed.append(index)
        value = await unit(tx)
        self.store.commit(tx)
        return value

    async def attempt_batch(
        self, worker: Worker, units: BatchUnits, first: int, *, flush_each: bool = False
    ) -> list[Any]:
        tx = Tx(self.store)
        values = []
        for position, (unit, index) in enumerate(units):
            if index in units.withdrawals.indexes:
                raise BatchUnitFailed(position, Withdrawn(index))
            self.executed.append(index)
            try:
                values.append(await unit(tx))
                if flush_each:
                    tx.flush()
            except Exception as error:
                raise BatchUnitFailed(position, error) from None
        if (position := units.withdrawals.commit_begins(units)) is not None:
            raise BatchUnitFailed(position, Withdrawn(units[position][1]))
        if self.committing is not None:
            self.committing()
        if self.commit_seconds:  # a cancelled run lets a COMMIT that began finish, as the executors do
            with anyio.CancelScope(shield=True):
                await anyio.sleep(self.commit_seconds)
        self.store.commit(tx)
        return values

    async def attempt_pinpointing(self, worker: Worker, units: BatchUnits, first: int) -> list[Any]:
        return await self.attempt_batch(worker, units, first, flush_each=True)


def writer(key: str, *, fail: Exception | None = None, seconds: float = 0.0) -> Unit:
    async def unit(tx: Tx) -> str:
        await anyio.sleep(seconds)
        tx.write(key, 1)
        if fail is not None:
            raise fail
        return key

    return unit


async def run_batches(
    units: Any,
    store: Store,
    *,
    size: int = 10,
    linger: float = 0.0,
    limit: int = 3,
    errors: str = "collect",
    retry: RetryPolicy | None = None,
) -> tuple[RunReport[Any], FakeBatchExecutor]:
    """What a runner's run() does with ``batch=``, on the fake executor."""
    limiter = Limiter(limit)
    attempts = Attempts(retry or RetryPolicy(attempts=1))
    executor = FakeBatchExecutor(attempts, store, BatchPolicy(size, linger))
    sink = ListSink()
    recorder = Recorder(NoPool())
    run = Run(units, sink, check=executor.check, stop_on_failure=errors == "raise", recorder=recorder)
    workers = limit if run.size == math.inf else int(min(limit, max(1, math.ceil(run.size / size))))
    read_ahead = run.read_ahead(limit * size)
    await drive(run, executor, attempts, SlidingWindow(), limiter, workers, read_ahead=read_ahead)
    assert limiter.in_flight == 0
    return run.report(sink.outcomes, recorder.finish()), executor


async def test_a_batch_commits_its_units_once_in_one_transaction() -> None:
    """100 units in batches of 10: 10 COMMITs, every row once, outcomes in input order."""
    store = Store()
    report, _ = await run_batches([writer(f"k{i}") for i in range(100)], store)
    assert store.commits == 10
    assert sorted(store.rows) == sorted(f"k{i}" for i in range(100))
    assert [o.index for o in report.outcomes] == list(range(100))
    assert report.values() == [f"k{i}" for i in range(100)]
    assert report.stats.batches_committed == 10
    assert report.stats.units_rerun == 0


async def test_a_failing_unit_fails_alone_and_the_rest_commit_once() -> None:
    """A unit that raises: its batch runs again without it, and it fails alone with its own error."""
    store = Store()
    units = [writer(f"k{i}", fail=KeyError(i) if i in (3, 15) else None) for i in range(20)]
    report, executor = await run_batches(units, store)
    assert [o.index for o in report.failures] == [3, 15]
    assert all(isinstance(o.error, KeyError) for o in report.failures)
    assert sorted(store.rows) == sorted(f"k{i}" for i in range(20) if i not in (3, 15))
    assert store.commits == 2
    assert report.stats.units_rerun == 4 + 6  # units 0-3, then 10-15, ran in a batch rolled back
    assert executor.executed.count(3) == 2  # in its batch, then alone


async def test_a_duplicate_key_within_a_batch_fails_only_the_second_writer() -> None:
    """Two units of one batch write one key: the first commits it, the second fails alone."""
    store = Store()
    units = [writer("same" if i in (4, 6) else f"k{i}") for i in range(10)]
    report, _ = await run_batches(units, store)
    assert [(o.index, type(o.error)) for o in report.failures] == [(6, Duplicate)]
    assert store.rows["same"] == 1
    assert len(store.rows) == 9


async def test_a_commit_that_names_no_unit_is_bisected_to_its_culprit() -> None:
    """A deferred check failing at COMMIT: halves, then quarters, until the culprit stands alone."""
    store = Store()
    units = [writer("deferred" if i == 13 else f"k{i}") for i in range(16)]
    report, _ = await run_batches(units, store, size=16)
    assert [(o.index, type(o.error)) for o in report.failures] == [(13, Deferred)]
    assert len(store.rows) == 15
    assert store.commits == 4  # 0-7, 8-11, 14-15, 12: each half that holds no culprit, once
    assert report.stats.batches_committed == 4


async def test_a_failure_that_names_no_unit_is_pinpointed_by_flushing_each_unit() -> None:
    """A duplicate that only the flush before COMMIT finds: one pass flushing each unit names it."""
    store = Store()
    store.rows["late-7"] = 0
    units = [writer("late-7" if i == 7 else f"k{i}") for i in range(16)]
    report, executor = await run_batches(units, store, size=16)
    assert [(o.index, type(o.error)) for o in report.failures] == [(7, Duplicate)]
    assert store.commits == 1  # the 15 others, together: no bisection
    assert report.stats.units_rerun == 16 + 8  # the batch, then the pinpointing pass up to unit 7
    assert executor.executed.count(7) == 3  # in the batch, in the pass, then alone


async def test_a_transient_error_retries_the_whole_batch_first() -> None:
    """A serialization failure at COMMIT runs the batch again as a whole, not split."""
    store = Store()
    store.fail_next_commit = Transient()
    retry = RetryPolicy(attempts=3, initial_delay=0.01, retry_on=lambda e: isinstance(e, Transient))
    report, _ = await run_batches([writer(f"k{i}") for i in range(10)], store, retry=retry, limit=1)
    assert all(o.ok for o in report.outcomes)
    assert {o.attempts for o in report.outcomes} == {2}
    assert store.commits == 1
    assert report.stats.units_rerun == 10


async def test_a_commit_of_unknown_fate_leaves_every_unit_of_its_batch_unknown() -> None:
    """A lost COMMIT: nobody knows, so every unit of that batch is commit_unknown, none run again."""
    store = Store()
    store.fail_next_commit = CommitUnknown(ConnectionError("lost"))
    report, executor = await run_batches([writer(f"k{i}") for i in range(10)], store, limit=1)
    assert all(o.commit_unknown and isinstance(o.error, ConnectionError) for o in report.outcomes)
    assert executor.executed == list(range(10))


async def test_with_errors_raise_a_unit_is_ok_if_and_only_if_it_committed() -> None:
    """RunFailed's report: ok exactly for the units whose rows are in the store."""
    store = Store()
    units = [writer(f"k{i}", fail=KeyError(i) if i == 7 else None) for i in range(40)]
    with pytest.raises(RunFailed) as raised:
        await run_batches(units, store, errors="raise", limit=2)
    report = raised.value.report
    assert report is not None
    for outcome in report.outcomes:
        assert outcome.ok == (f"k{outcome.index}" in store.rows)


async def test_a_slow_async_input_starts_a_batch_after_linger_with_what_it_has() -> None:
    """Units that trickle in: a batch waits at most linger for more, then starts."""
    store = Store()

    async def trickle() -> AsyncIterator[Unit]:
        for i in range(6):
            yield writer(f"k{i}")
            await anyio.sleep(0.05)

    report, _ = await run_batches(trickle(), store, size=50, linger=0.005, limit=1)
    assert all(o.ok for o in report.outcomes)
    assert store.commits == 6  # each unit came after the last batch had stopped waiting


async def test_a_fast_async_input_fills_its_batches() -> None:
    """An async input that never waits: full batches, as from a list."""
    store = Store()

    async def fast() -> AsyncIterator[Unit]:
        for i in range(100):
            yield writer(f"k{i}")

    report, _ = await run_batches(fast(), store, size=25, linger=0.0)
    assert len(report.outcomes) == 100
    assert store.commits <= 4 + 3  # full batches, but for the workers' first pulls


# -- submit(): calls gathered into batches --------------------------------------------------------


class Gathered:
    """A Gather on the fake executor, as a runner's submit() with ``batch=`` uses it."""

    def __init__(self, store: Store, size: int, linger: float, limit: int = 2) -> None:
        self.store = store
        self.limiter = Limiter(limit)
        self.attempts = Attempts(RetryPolicy(attempts=1))
        self.executor = FakeBatchExecutor(self.attempts, store, BatchPolicy(size, linger))
        self.gather = Gather(size, linger, self.limiter, self.run_batch)
        self.batches: list[int] = []

    async def run_batch(
        self,
        units: list[Any],
        priority: int,
        settled: Callable[[Outcome[Any]], None],
        slot: Slot,
        withdrawals: Withdrawals,
    ) -> None:
        self.batches.append(len(units))
        run = Run(
            units, CallbackSink(settled), check=self.executor.check, stop_on_failure=False,
            recorder=Recorder(NoPool()), priority=priority,
        )  # fmt: skip
        run.withdrawals = withdrawals
        await drive(run, self.executor, self.attempts, SlidingWindow(), self.limiter, 1, slot=slot)

    async def submit(
        self, unit: Unit, priority: int = 0, hook: Callable[[Outcome[Any]], object] | None = None
    ) -> Any:
        outcome = await self.gather.submit(unit, priority, hook)
        if hook is not None:  # as submit_unit() does once the call returns
            hook(outcome)
        return outcome.unwrap()


async def test_concurrent_submits_share_batches_and_each_gets_its_own_value() -> None:
    """40 calls at once, batches of 10 lingering: 4 transactions, each call its own value."""
    store = Store()
    gathered = Gathered(store, size=10, linger=0.05)
    values: dict[int, Any] = {}

    async def call(i: int) -> None:
        values[i] = await gathered.submit(writer(f"k{i}"))
        assert f"k{i}" in store.rows  # committed before submit() returned

    async with anyio.create_task_group() as group:
        for i in range(40):
            group.start_soon(call, i)
    assert values == {i: f"k{i}" for i in range(40)}
    assert store.commits == 4
    assert gathered.batches == [10, 10, 10, 10]


async def test_without_linger_calls_that_wait_for_a_slot_share_a_batch() -> None:
    """linger=0, one slot busy: the calls that queue meanwhile go in the next batch together."""
    store = Store()
    gathered = Gathered(store, size=100, linger=0.0, limit=1)

    async with anyio.create_task_group() as group:
        group.start_soon(gathered.submit, writer("first", seconds=0.5))
        await anyio.wait_all_tasks_blocked()
        for i in range(30):
            group.start_soon(gathered.submit, writer(f"k{i}"))
    assert gathered.batches == [1, 30]
    assert store.commits == 2


async def test_a_submit_above_priority_0_is_never_held_by_linger() -> None:
    """priority=1 starts at once, though linger is long and its batch is not full."""
    store = Store()
    gathered = Gathered(store, size=10, linger=1000.0)
    started = anyio.current_time()
    assert await gathered.submit(writer("urgent"), priority=1) == "urgent"
    assert anyio.current_time() - started < 1000.0


async def test_closing_starts_the_lingering_batch_at_once() -> None:
    """close(): a batch waiting for more units starts now; nothing submitted is lost."""
    store = Store()
    gathered = Gathered(store, size=10, linger=1000.0)
    results: list[Any] = []

    async def call(i: int) -> None:
        results.append(await gathered.submit(writer(f"k{i}")))

    async with anyio.create_task_group() as group:
        for i in range(3):
            group.start_soon(call, i)
        await anyio.wait_all_tasks_blocked()
        started = anyio.current_time()
        gathered.gather.close()
    assert sorted(results) == ["k0", "k1", "k2"]
    assert anyio.current_time() - started < 1000.0
    assert store.commits == 1


async def test_a_failing_submit_raises_its_own_error_and_its_batch_mates_commit() -> None:
    """One call's unit raises: that call raises it; the others' rows commit once."""
    store = Store()
    gathered = Gathered(store, size=5, linger=0.05)
    outcomes: dict[int, Any] = {}

    async def call(i: int) -> None:
        try:
            outcomes[i] = await gathered.submit(writer(f"k{i}", fail=KeyError(i) if i == 2 else None))
        except KeyError as error:
            outcomes[i] = error

    async with anyio.create_task_group() as group:
        for i in range(5):
            group.start_soon(call, i)
    assert isinstance(outcomes.pop(2), KeyError)
    assert outcomes == {i: f"k{i}" for i in (0, 1, 3, 4)}
    assert sorted(store.rows) == ["k0", "k1", "k3", "k4"]


async def test_a_call_cancelled_while_it_waits_never_runs() -> None:
    """A call cancelled before its batch started: its unit is withdrawn, the others run."""
    store = Store()
    gathered = Gathered(store, size=10, linger=0.5)

    async with anyio.create_task_group() as group:
        group.start_soon(gathered.submit, writer("kept"))
        with anyio.move_on_after(0.1):
            await gathered.submit(writer("withdrawn"))
    assert list(store.rows) == ["kept"]


async def test_a_call_cancelled_while_its_batch_runs_withdraws_its_unit() -> None:
    """A follower gives up mid-batch: its unit never commits; the others commit once, without it."""
    store = Store()
    gathered = Gathered(store, size=10, linger=0.01)
    quitter = anyio.CancelScope()
    values: list[Any] = []

    async def follower(i: int, seconds: float) -> None:
        values.append(await gathered.submit(writer(f"k{i}", seconds=seconds)))

    async def quitting() -> None:
        with quitter:
            await gathered.submit(writer("quitter", seconds=1.0))

    async with anyio.create_task_group() as group:
        group.start_soon(follower, 0, 0.01)
        group.start_soon(quitting)
        group.start_soon(follower, 1, 0.01)
        await anyio.sleep(0.5)  # the batch of three is in the quitter's unit
        quitter.cancel()
    assert sorted(values) == ["k0", "k1"]
    assert sorted(store.rows) == ["k0", "k1"]
    assert store.commits == 1


async def test_a_leader_cancelled_mid_batch_leaves_the_others_to_the_next_leader() -> None:
    """The call running a batch is cancelled: the batch rolls back, the others' units commit once."""
    store = Store()
    gathered = Gathered(store, size=10, linger=0.01)
    leader_scope = anyio.CancelScope()
    values: list[Any] = []

    async def leader(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with leader_scope:
            task_status.started()  # then submit() queues its call before it first waits
            await gathered.submit(writer("leader", seconds=1.0))

    async def follower(i: int) -> None:
        values.append(await gathered.submit(writer(f"k{i}", seconds=0.01)))

    async with anyio.create_task_group() as group:
        await group.start(leader)
        for i in range(3):
            group.start_soon(follower, i)
        await anyio.sleep(0.5)  # the mock clock: the batch of four is in its first unit
        leader_scope.cancel()
    assert sorted(values) == ["k0", "k1", "k2"]
    assert sorted(store.rows) == ["k0", "k1", "k2"]


def until_cancelled(key: str, started: anyio.Event) -> Unit:
    """Writes ``key``, says it started, then waits until its batch is cancelled."""

    async def unit(tx: Tx) -> str:
        tx.write(key, 1)
        started.set()
        await anyio.sleep_forever()
        return key  # pragma: no cover

    return unit


async def test_a_call_cancelled_after_its_unit_returned_still_withdraws_it() -> None:
    """A follower whose unit returned gives up while a later unit of its batch runs: it never commits."""
    store = Store()
    gathered = Gathered(store, size=2, linger=0.01)
    started, quitter, heard = anyio.Event(), anyio.CancelScope(), []  # type: list[Outcome[Any]]
    leader_scope = anyio.CancelScope()

    async def quitting() -> None:
        with quitter:
            await gathered.submit(writer("quitter"), hook=heard.append)

    async def leader() -> None:
        with leader_scope:
            await gathered.submit(until_cancelled("leader", started))

    async with anyio.create_task_group() as group:
        group.start_soon(quitting)  # position 0: it leads, and its unit returns first
        await anyio.wait_all_tasks_blocked()
        group.start_soon(leader)
        await started.wait()  # the quitter's unit returned; the batch runs the next one
        quitter.cancel()
        await anyio.wait_all_tasks_blocked()
        leader_scope.cancel()
    assert quitter.cancelled_caught
    assert heard == []
    assert store.rows == {}


async def test_a_withdrawn_call_is_not_put_back_when_its_leader_is_cancelled() -> None:
    """B gives up, then its leader A: the batch rolls back, and only C, whose caller waits, commits."""
    store = Store()
    gathered = Gathered(store, size=3, linger=0.01)
    started = anyio.Event()
    scopes = {name: anyio.CancelScope() for name in "ABC"}
    values: list[Any] = []

    async def call(name: str, unit: Unit) -> None:
        with scopes[name]:
            values.append(await gathered.submit(unit))

    async with anyio.create_task_group() as group:
        group.start_soon(call, "A", until_cancelled("A", started))
        await anyio.wait_all_tasks_blocked()
        group.start_soon(call, "B", writer("B"))
        group.start_soon(call, "C", writer("C"))
        await started.wait()
        scopes["B"].cancel()
        await anyio.wait_all_tasks_blocked()
        scopes["A"].cancel()
    assert values == ["C"]
    assert store.rows == {"C": 1}


async def test_a_call_cancelled_while_its_batch_commits_waits_and_hears_it_committed() -> None:
    """A follower and the leader cancelled while their batch's COMMIT runs: both hooks hear ok, once."""
    store = Store()
    gathered = Gathered(store, size=2, linger=0.01)
    gathered.executor.commit_seconds = 1.0
    committing = anyio.Event()
    gathered.executor.committing = committing.set
    scopes = [anyio.CancelScope(), anyio.CancelScope()]
    heard: list[list[Outcome[Any]]] = [[], []]

    async def call(i: int) -> None:
        with scopes[i]:
            await gathered.submit(writer(f"k{i}"), hook=heard[i].append)

    async with anyio.create_task_group() as group:
        for i in range(2):
            group.start_soon(call, i)
        await committing.wait()
        scopes[1].cancel()
        scopes[0].cancel()
    # The follower's cancellation is too late to withdraw its unit; the leader, on trio, may return
    # before a checkpoint delivers its own, and then its hook hears the outcome as a call's does.
    assert any(scope.cancelled_caught for scope in scopes)
    assert [[(o.ok, o.value) for o in told] for told in heard] == [[(True, "k0")], [(True, "k1")]]
    assert store.rows == {"k0": 1, "k1": 1}
