"""The core in memory: pacing, retries, stopping and cancellation, driven by a fake executor (no database).

Units here are ``async def unit(index)``; the fake executor runs them inline in anyio tasks, as the
async executor does in its own tasks. Under trio the tests use an autojumping mock clock, so a unit's
"work" (a sleep) takes no real time and every interleaving is deterministic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
from trio.testing import MockClock

from boundeddb import RetryPolicy, RunFailed, UnitMisuseError
from boundeddb._core.attempts import Attempts, CommitUnknown, ConnectFailed, UnitMisuse
from boundeddb._core.limiter import Limiter
from boundeddb._core.pacing import Chunks, SlidingWindow, drive
from boundeddb._core.recorder import Recorder
from boundeddb._core.run import Run
from boundeddb._core.sinks import ListSink
from boundeddb._outcome import Outcome, RunReport
from tests.support.fakes import FakeExecutor, NoPool

pytestmark = [pytest.mark.anyio]

Unit = Callable[[int], Awaitable[Any]]


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    return "asyncio"


async def run_units(
    units: Any,
    *,
    limit: int = 3,
    errors: str = "raise",
    retry: RetryPolicy | None = None,
    chunks: bool = False,
    limiter: Limiter | None = None,
    priority: int = 0,
) -> RunReport[Any]:
    """What a runner's run() does, on the fake executor."""
    limiter = limiter or Limiter(limit)
    attempts = Attempts(retry or RetryPolicy(attempts=1))
    executor = FakeExecutor(attempts)
    sink = ListSink()
    recorder = Recorder(NoPool())
    run = Run(
        units,
        sink,
        check=executor.check,
        stop_on_failure=errors == "raise",
        recorder=recorder,
        priority=priority,
    )
    workers = int(min(limiter.share(priority), max(1, run.size)))
    pacer = Chunks(workers) if chunks else SlidingWindow()
    await drive(run, executor, attempts, pacer, limiter, workers)
    return run.report(sink.outcomes, recorder.finish())


class Spy:
    """Counts units running at once (aiometer's TestMaxAtOnce.Spy) and logs starts and ends."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.log: list[tuple[str, int]] = []

    def unit(self, seconds: float = 0.01, *, fail: bool = False) -> Unit:
        async def unit(index: int) -> int:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.log.append(("start", index))
            try:
                await anyio.sleep(seconds)
                if fail:
                    raise KeyError(index)
                return index
            finally:
                self.running -= 1
                self.log.append(("end", index))

        return unit


class Boom(Exception):
    pass


# -- the sliding window ----------------------------------------------------------------------------


async def test_the_window_stays_full_and_never_exceeds_the_limit() -> None:
    """Units of varied lengths: exactly ``limit`` run at once at the peak, values come back in order."""
    spy = Spy()
    report = await run_units([spy.unit(0.001 * (i % 7 + 1)) for i in range(60)], limit=4)
    assert report.values() == list(range(60))
    assert spy.peak == 4
    assert report.stats.peak_in_flight == 4
    assert (report.stats.submitted, report.stats.succeeded) == (60, 60)


async def test_the_input_is_pulled_no_further_ahead_than_the_limit() -> None:
    """A generator is pulled one unit per free slot: never more than ``limit`` units ahead."""
    spy = Spy()
    ahead: list[int] = []
    pulled = 0

    def units() -> Iterator[Unit]:
        nonlocal pulled
        for _ in range(100):
            pulled += 1
            finished = sum(1 for kind, _ in spy.log if kind == "end")
            ahead.append(pulled - finished)
            yield spy.unit()

    await run_units(units(), limit=5)
    assert max(ahead) <= 5


async def test_an_async_input_is_pulled_by_one_worker_at_a_time() -> None:
    """An async generator is never entered by two workers at once (it would raise if it were)."""
    spy = Spy()

    async def units() -> AsyncIterator[Unit]:
        for i in range(30):
            await anyio.sleep(0.001 * (i % 3))  # the generator awaits between units
            yield spy.unit()

    report = await run_units(units(), limit=4)
    assert report.values() == list(range(30))


async def test_two_runs_on_one_limiter_share_its_slots() -> None:
    """Concurrent runs of one runner never have more than the limit in flight between them."""
    spy = Spy()
    limiter = Limiter(3)
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(lambda: run_units([spy.unit() for _ in range(20)], limit=3, limiter=limiter))
    assert spy.peak == 3
    assert limiter.in_flight == 0


# -- chunks ----------------------------------------------------------------------------------------


async def test_chunks_wait_for_their_slowest_unit() -> None:
    """No unit of chunk k+1 starts before every unit of chunk k has ended."""
    spy = Spy()
    size = 4
    report = await run_units(
        [spy.unit(0.05 if i % size == 0 else 0.001) for i in range(12)], limit=size, chunks=True
    )
    assert report.values() == list(range(12))
    for k in (1, 2):
        first_start = min(spy.log.index(("start", i)) for i in range(k * size, (k + 1) * size))
        last_end = max(spy.log.index(("end", i)) for i in range((k - 1) * size, k * size))
        assert last_end < first_start
    assert spy.peak == size


async def test_a_short_last_chunk_does_not_wait_for_workers_that_ran_out() -> None:
    """7 units in chunks of 3: the barrier lets the last, short chunk through."""
    report = await run_units([Spy().unit() for _ in range(7)], limit=3, chunks=True)
    assert report.values() == list(range(7))


# -- failures --------------------------------------------------------------------------------------


async def test_errors_raise_stops_pulling_and_drains_what_is_in_flight() -> None:
    """After the first failure no unit starts; the ones in flight finish; RunFailed holds the report."""
    spy = Spy()
    pulled = 0

    def units() -> Iterator[Unit]:
        nonlocal pulled
        for i in range(100):
            pulled += 1
            yield spy.unit(0.01, fail=i == 5)

    with pytest.raises(RunFailed) as caught:
        await run_units(units(), limit=3)
    report = caught.value.report
    assert [type(e) for e in caught.value.exceptions] == [KeyError]
    assert pulled == report.stats.submitted < 10
    assert [o.index for o in report.outcomes] == list(range(report.stats.submitted))
    assert spy.running == 0


async def test_errors_collect_runs_every_unit() -> None:
    """With errors="collect" every unit has an outcome and nothing raises."""
    report = await run_units([Spy().unit(fail=i % 3 == 0) for i in range(12)], errors="collect")
    assert [o.ok for o in report.outcomes] == [i % 3 != 0 for i in range(12)]


@pytest.mark.parametrize("errors", ["raise", "collect"])
async def test_a_unit_that_is_not_callable_follows_errors(errors: str) -> None:
    """A refused unit stops a raising run (UnitMisuseError), and is an outcome of a collecting one."""

    def units() -> Iterator[Any]:
        yield Spy().unit()
        yield "not a unit"
        yield Spy().unit()

    if errors == "raise":
        with pytest.raises(UnitMisuseError, match=r"^unit 1 is not callable$"):
            await run_units(units(), limit=1)
        return
    report = await run_units(units(), limit=1, errors="collect")
    assert [o.ok for o in report.outcomes] == [True, False, True]
    assert isinstance(report.outcomes[1].error, UnitMisuseError)
    assert report.outcomes[1].attempts == 0


async def test_a_failing_input_drains_then_raises_its_own_error() -> None:
    """If the iterable raises, units in flight finish and that exception comes through unchanged."""
    spy = Spy()

    def units() -> Iterator[Unit]:
        yield from (spy.unit() for _ in range(5))
        raise LookupError("input broke")

    with pytest.raises(LookupError, match="input broke"):
        await run_units(units(), limit=3)
    assert spy.running == 0
    assert sum(1 for kind, _ in spy.log if kind == "end") == 5


# -- retries ---------------------------------------------------------------------------------------


class Flaky:
    """A unit that fails its first ``failures`` attempts, logging each attempt."""

    def __init__(self, log: list[str], failures: int) -> None:
        self.log = log
        self.failures = failures
        self.attempts = 0

    async def __call__(self, index: int) -> int:
        self.attempts += 1
        self.log.append(f"unit {index} attempt {self.attempts}")
        await anyio.sleep(0.001)
        if self.attempts <= self.failures:
            raise Boom(index)
        return index


def on_mock_clock() -> Any:
    """Run a test on trio's autojumping clock only: it asserts how a back-off and a short unit interleave."""
    return pytest.mark.parametrize("anyio_backend", [("trio", {"clock": MockClock(autojump_threshold=0)})])


@on_mock_clock()
async def test_a_retry_backs_off_without_its_slot() -> None:
    """limit=1: while unit 0 backs off, unit 1 runs in its slot; then unit 0 is tried again."""
    log: list[str] = []

    async def second(index: int) -> int:
        log.append(f"unit {index}")
        return index

    retry = RetryPolicy(attempts=2, initial_delay=1.0, jitter=False, retry_on=lambda error: True)
    report = await run_units([Flaky(log, failures=1), second], limit=1, retry=retry)
    assert log == ["unit 0 attempt 1", "unit 1", "unit 0 attempt 2"]
    assert report.values() == [0, 1]
    assert report.outcomes[0].attempts == 2
    assert report.stats.retried == 1
    assert report.stats.peak_in_flight == 1


@on_mock_clock()
async def test_a_chunk_waits_for_its_retries() -> None:
    """In chunks a unit is retried in place: the next chunk starts after the retry settled."""
    log: list[str] = []

    async def plain(index: int) -> int:
        log.append(f"unit {index}")
        return index

    retry = RetryPolicy(attempts=2, initial_delay=1.0, jitter=False, retry_on=lambda error: True)
    await run_units([Flaky(log, failures=1), plain, plain], limit=2, retry=retry, chunks=True)
    assert log.index("unit 0 attempt 2") < log.index("unit 2")


async def test_retries_that_run_out_give_the_last_error() -> None:
    """After the policy's attempts, the unit fails with its last attempt's exception."""
    log: list[str] = []
    retry = RetryPolicy(attempts=3, initial_delay=0.001, jitter=False, retry_on=lambda error: True)
    report = await run_units([Flaky(log, failures=5)], retry=retry, errors="collect")
    [outcome] = report.outcomes
    assert isinstance(outcome.error, Boom)
    assert outcome.attempts == 3
    assert report.stats.retried == 2


# -- settling an attempt ---------------------------------------------------------------------------


def test_a_connection_that_could_not_open_is_retried_whatever_the_predicate() -> None:
    """Nothing was sent: ConnectFailed is retried while attempts remain, then fails with its cause."""
    attempts = Attempts(RetryPolicy(attempts=2, initial_delay=0.5, jitter=False, retry_on=lambda e: False))
    cause = OSError("refused")
    assert attempts.settle(ConnectFailed(cause), 0, 1, 0.1, 0.0) == 0.5
    outcome = attempts.settle(ConnectFailed(cause), 0, 2, 0.1, 0.0)
    assert isinstance(outcome, Outcome)
    assert outcome.error is cause


def test_a_commit_of_unknown_fate_is_never_retried() -> None:
    """Even a policy that retries everything leaves a commit_unknown unit alone."""
    attempts = Attempts(RetryPolicy(attempts=5, retry_on=lambda e: True))
    cause = ConnectionResetError("gone")
    outcome = attempts.settle(CommitUnknown(cause), 3, 1, 0.1, 0.0)
    assert isinstance(outcome, Outcome)
    assert (outcome.error, outcome.commit_unknown, outcome.attempts) == (cause, True, 1)


def test_misuse_is_never_retried() -> None:
    """A unit that broke the contract fails with UnitMisuseError whatever the policy."""
    attempts = Attempts(RetryPolicy(attempts=5, retry_on=lambda e: True))
    outcome = attempts.settle(UnitMisuse("unit 0 did it"), 0, 1, 0.1, 0.0)
    assert isinstance(outcome, Outcome)
    assert isinstance(outcome.error, UnitMisuseError)


# -- cancellation ----------------------------------------------------------------------------------


async def test_a_cancelled_run_gives_every_slot_back_and_pulls_nothing_more() -> None:
    """Cancelling a run with units in flight and more waiting: all slots back, no unit pulled after."""
    spy = Spy()
    limiter = Limiter(3)
    pulled = 0

    def units() -> Iterator[Unit]:
        nonlocal pulled
        for _ in range(1000):
            pulled += 1
            yield spy.unit(3600)

    with anyio.move_on_after(1):
        await run_units(units(), limiter=limiter)
    assert limiter.in_flight == 0
    assert spy.running == 0
    assert pulled == 3


async def test_a_unit_that_ends_up_owed_a_retry_as_the_run_is_cancelled_is_dropped() -> None:
    """A back-off in progress is cancelled with the run: nothing is left running or holding a slot."""
    log: list[str] = []
    limiter = Limiter(1)
    retry = RetryPolicy(attempts=3, initial_delay=3600, jitter=False, retry_on=lambda error: True)
    with anyio.move_on_after(1):
        await run_units([Flaky(log, failures=1)], limiter=limiter, retry=retry)
    assert log == ["unit 0 attempt 1"]
    assert limiter.in_flight == 0


# -- priorities and the reserve ---------------------------------------------------------------------


async def test_a_bulk_run_never_uses_the_reserve_and_chunks_shrink_to_fit() -> None:
    """Limit 4, reserve 1: a priority-0 run keeps 3 in flight, in a window or in chunks of 3."""
    for chunks in (False, True):
        spy = Spy()
        limiter = Limiter(4, reserve=1)
        report = await run_units([spy.unit() for _ in range(12)], limiter=limiter, chunks=chunks)
        assert report.values() == list(range(12))
        assert spy.peak == report.stats.peak_in_flight == 3
        if chunks:  # every chunk of 3 ends before the next starts
            starts = [spy.log.index(("start", i)) for i in range(12)]
            ends = [spy.log.index(("end", i)) for i in range(12)]
            assert all(max(ends[k : k + 3]) < min(starts[k + 3 : k + 6]) for k in range(0, 9, 3))


@on_mock_clock()
@pytest.mark.parametrize("reserve", [0, 1])
async def test_interactive_units_go_ahead_of_a_saturating_bulk_run(reserve: int) -> None:
    """
    Two bulk runs of 1 s units fill the slots and queue for more; a priority-1 unit arrives every
    0.25 s. With a reserve it starts at once; without one it waits for the next bulk unit to end
    (never for two): it goes ahead of the bulk workers queued before it.
    """
    limiter = Limiter(4, reserve=reserve)
    spy = Spy()
    waits: list[float] = []

    async def interactive(arrived: float) -> None:
        async def unit(index: int) -> None:
            waits.append(anyio.current_time() - arrived)

        await run_units([unit], limiter=limiter, priority=1)

    async with anyio.create_task_group() as group:
        for _ in range(2):
            group.start_soon(lambda: run_units([spy.unit(1.0) for _ in range(20)], limiter=limiter))
        await anyio.sleep(0.1)  # the bulk run fills its slots
        for _ in range(20):
            group.start_soon(interactive, anyio.current_time())
            await anyio.sleep(0.25)
    assert len(waits) == 20
    assert spy.peak == 4 - reserve
    if reserve:
        assert max(waits) == 0.0, waits
    else:
        assert 0.0 < max(waits) <= 1.0, waits  # one bulk unit's length at most
