"""The Limiter in memory: who gets a freed slot, limits that move, and reads from other threads."""

from __future__ import annotations

import asyncio
import threading

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pytest
from anyio import wait_all_tasks_blocked

from boundeddb import RunnerStatistics
from boundeddb._core.limiter import Limiter, Slot

pytestmark = [pytest.mark.anyio]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def figures(limiter: Limiter) -> tuple[int, int, int]:
    """(limit, in flight, waiting)."""
    stats = limiter.statistics()
    return stats.limit, stats.in_flight, stats.waiting


class Order:
    """Records the order in which waiters got their slot."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.granted: list[str] = []

    async def take(self, name: str, priority: int = 0) -> None:
        await self.limiter.acquire(priority)
        self.granted.append(name)

    async def arrive(self, group: anyio.abc.TaskGroup, name: str, priority: int = 0) -> None:
        """Start a waiter and let it reach the limiter before anyone else (trio starts tasks in any order)."""
        group.start_soon(self.take, name, priority)
        await wait_all_tasks_blocked()


async def test_it_grants_up_to_the_limit_then_queues() -> None:
    """Three slots go at once; the fourth acquirer waits until one comes back."""
    limiter = Limiter(3)
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        for name in "abcd":
            await order.arrive(group, name)
        assert order.granted == ["a", "b", "c"]
        assert figures(limiter) == (3, 3, 1)
        limiter.release()
        await wait_all_tasks_blocked()
        assert order.granted == ["a", "b", "c", "d"]
    assert limiter.in_flight == 3


async def test_a_freed_slot_goes_to_the_highest_priority_then_first_come() -> None:
    """Waiters are served by priority, first come first served within one priority."""
    limiter = Limiter(1)
    await limiter.acquire()
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        for name, priority in [("low1", 0), ("high1", 2), ("mid", 1), ("low2", 0), ("high2", 2)]:
            await order.arrive(group, name, priority)
        for held in [0, 2, 2, 1, 0]:  # the initial slot, then each waiter's in turn
            limiter.release(held)
            await wait_all_tasks_blocked()
    assert order.granted == ["high1", "high2", "mid", "low1", "low2"]


async def test_a_free_slot_is_not_taken_past_a_waiter_of_equal_or_higher_priority() -> None:
    """try_acquire does not barge: only a strictly higher priority may pass queued waiters."""
    limiter = Limiter(1)
    await limiter.acquire()
    async with anyio.create_task_group() as group:
        group.start_soon(limiter.acquire, 1)
        await wait_all_tasks_blocked()
        limiter.set_limit(2)  # one slot frees up, and goes to the waiter at once
        assert limiter.in_flight == 2
        assert not limiter.try_acquire(5)  # none left
        limiter.release()
        limiter.release(1)
    assert limiter.in_flight == 0
    assert limiter.try_acquire(0)


async def test_a_cancelled_waiter_gives_nothing_away() -> None:
    """A waiter cancelled before its turn leaves the queue; the next waiter gets the slot."""
    limiter = Limiter(1)
    await limiter.acquire()
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        doomed = anyio.CancelScope()
        group.start_soon(_take_in_scope, order, "doomed", doomed)
        await wait_all_tasks_blocked()
        await order.arrive(group, "next")
        doomed.cancel()
        await wait_all_tasks_blocked()
        assert limiter.statistics().waiting == 1
        limiter.release()
        await wait_all_tasks_blocked()
    assert order.granted == ["next"]
    assert limiter.in_flight == 1


async def _take_in_scope(order: Order, name: str, scope: anyio.CancelScope, priority: int = 0) -> None:
    with scope:
        await order.take(name, priority)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_slot_granted_to_a_waiter_as_it_is_cancelled_is_passed_on() -> None:
    """A native Task.cancel() in the step the slot arrives: the slot goes to the next waiter."""
    limiter = Limiter(1)
    await limiter.acquire()
    order = Order(limiter)
    cancelled = asyncio.ensure_future(order.take("cancelled"))
    await wait_all_tasks_blocked()
    following = asyncio.ensure_future(order.take("next"))
    await wait_all_tasks_blocked()
    limiter.release()  # granted to "cancelled" ...
    cancelled.cancel()  # ... which is cancelled before it runs again
    await asyncio.wait({cancelled, following})
    assert cancelled.cancelled()
    assert order.granted == ["next"]
    assert limiter.in_flight == 1


async def test_raising_the_limit_grants_waiters_at_once() -> None:
    """set_limit(up) hands the new slots to the queue immediately."""
    limiter = Limiter(1)
    await limiter.acquire()
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        for name in "abc":
            await order.arrive(group, name)
        limiter.set_limit(3)
        await wait_all_tasks_blocked()
        assert sorted(order.granted) == ["a", "b"]  # the first two in line (they resume in any order)
        assert figures(limiter) == (3, 3, 1)
        group.cancel_scope.cancel()


async def test_lowering_the_limit_never_over_grants() -> None:
    """set_limit(down) grants nothing until enough slots came back; in_flight <= limit throughout."""
    limiter = Limiter(4)
    for _ in range(4):
        await limiter.acquire()
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        await order.arrive(group, "waiter")
        limiter.set_limit(2)
        seen = [(limiter.limit, limiter.in_flight)]
        for _ in range(3):
            limiter.release()
            await wait_all_tasks_blocked()
            seen.append((limiter.limit, limiter.in_flight))
        assert all(in_flight <= limit for limit, in_flight in seen), seen
        # 4 held -> 3 -> 2 (the limit reached 2; nothing granted) -> 1, then the waiter gets one.
        assert seen == [(4, 4), (3, 3), (2, 2), (2, 2)]
        assert order.granted == ["waiter"]
    assert limiter.limit == 2


async def test_a_slot_is_given_back_once() -> None:
    """Slot.give() twice releases once, so clean-up can call it blindly."""
    limiter = Limiter(2)
    slot = Slot(limiter)
    await slot.take()
    assert limiter.in_flight == 1
    slot.give()
    slot.give()
    assert limiter.in_flight == 0


async def test_worker_threads_read_the_figures_safely() -> None:
    """Threads reading statistics and should_yield while the loop grants and releases see a sane state."""
    limiter = Limiter(3)
    stop = threading.Event()
    broken: list[RunnerStatistics] = []

    reading = anyio.Event()

    def read() -> int:
        reads = 0
        while not stop.is_set():
            stats = limiter.statistics()
            limiter.should_yield()
            if not 0 <= stats.in_flight <= stats.limit or stats.waiting < 0:
                broken.append(stats)
            reads += 1
            if reads == 1:  # the churn starts once this thread reads (a loaded machine starts it late)
                anyio.from_thread.run_sync(reading.set)
        return reads

    async def churn() -> None:
        for _ in range(2000):
            await limiter.acquire()
            await anyio.lowlevel.checkpoint()
            limiter.release()

    reads: list[int] = []

    async def reader() -> None:
        reads.append(await anyio.to_thread.run_sync(read))

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        await reading.wait()
        async with anyio.create_task_group() as churners:
            for _ in range(6):
                churners.start_soon(churn)
        stop.set()
    assert broken == []
    assert reads[0] > 0
    assert limiter.in_flight == 0


async def test_should_yield_when_someone_waits() -> None:
    """A holder that could go on is told to yield while another caller waits for a slot."""
    limiter = Limiter(1)
    await limiter.acquire()
    assert not limiter.should_yield()
    async with anyio.create_task_group() as group:
        group.start_soon(limiter.acquire)
        await wait_all_tasks_blocked()
        assert limiter.should_yield()
        limiter.release()
    assert not limiter.should_yield()


# -- the reserve -------------------------------------------------------------------------------------


async def test_a_reserved_slot_is_never_lent_to_priority_0_work() -> None:
    """Limit 3, reserve 1: priority 0 holds at most 2, and waits while the reserved slot sits idle."""
    limiter = Limiter(3, reserve=1)
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        for name in ("bulk1", "bulk2", "bulk3"):
            await order.arrive(group, name)
        assert order.granted == ["bulk1", "bulk2"]
        stats = limiter.statistics()
        assert (stats.limit, stats.reserve, stats.in_flight, stats.waiting) == (3, 1, 2, 1)
        assert stats.waiting_by_priority == {0: 1}
        assert stats.in_flight_by_priority == {0: 2}
        assert limiter.should_yield()  # a bulk waiter: holders that could go on give way
        await order.arrive(group, "interactive", 1)  # the reserved slot, at once
        assert order.granted == ["bulk1", "bulk2", "interactive"]
        assert limiter.statistics().in_flight_by_priority == {0: 2, 1: 1}
        limiter.release(1)  # the reserved slot comes back: still not for bulk3
        await wait_all_tasks_blocked()
        assert order.granted == ["bulk1", "bulk2", "interactive"]
        limiter.release(0)  # a shared slot comes back: bulk3's
        await wait_all_tasks_blocked()
        assert order.granted == ["bulk1", "bulk2", "interactive", "bulk3"]
    assert limiter.statistics().in_flight_by_priority == {0: 2}


async def test_a_high_priority_waiter_gets_the_next_slot_of_any_kind() -> None:
    """With every slot held, a priority-1 waiter gets the first slot back, shared or reserved."""
    limiter = Limiter(2, reserve=1)
    assert limiter.try_acquire(0)
    assert limiter.try_acquire(1)
    assert not limiter.try_acquire(0)
    assert not limiter.try_acquire(1)
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        await order.arrive(group, "bulk")
        await order.arrive(group, "first", 1)
        await order.arrive(group, "second", 1)
        assert limiter.statistics().waiting_by_priority == {0: 1, 1: 2}
        limiter.release(0)  # a shared slot: to the head of the queue, priority 1
        await wait_all_tasks_blocked()
        assert order.granted == ["first"]
        limiter.release(1)
        await wait_all_tasks_blocked()
        assert order.granted == ["first", "second"]
        limiter.release(1)  # the reserved slot: bulk may not have it
        limiter.release(1)  # ... and the shared one "first" held: bulk may
        await wait_all_tasks_blocked()
        assert order.granted == ["first", "second", "bulk"]
    assert limiter.in_flight == 1


async def test_a_cancelled_high_priority_waiter_gives_nothing_away() -> None:
    """A priority-1 waiter cancelled in the queue leaves no count behind and takes no slot."""
    limiter = Limiter(2, reserve=1)
    assert limiter.try_acquire(0)
    assert limiter.try_acquire(1)
    order = Order(limiter)
    async with anyio.create_task_group() as group:
        doomed = anyio.CancelScope()
        group.start_soon(_take_in_scope, order, "doomed", doomed, 1)
        await wait_all_tasks_blocked()
        assert limiter.statistics().waiting_by_priority == {1: 1}
        doomed.cancel()
        await wait_all_tasks_blocked()
        stats = limiter.statistics()
        assert (stats.waiting, stats.waiting_by_priority, stats.in_flight) == (0, {}, 2)
        limiter.release(1)
    assert order.granted == []
    assert limiter.statistics().in_flight_by_priority == {0: 1}


async def test_lowering_the_limit_shrinks_the_shared_slots_and_keeps_the_reserve() -> None:
    """Limit 4 -> 2 with reserve 1: priority 0 gets nothing until it holds fewer than 1; the reserve stays."""
    limiter = Limiter(4, reserve=1)
    for _ in range(3):
        assert limiter.try_acquire(0)
    limiter.set_limit(2)
    assert limiter.should_yield()  # 3 shared slots held, 1 allowed
    for _ in range(2):
        limiter.release(0)
        assert not limiter.try_acquire(0)
    assert not limiter.should_yield()
    assert limiter.try_acquire(1)  # the reserve is still there
    assert (limiter.limit, limiter.in_flight) == (2, 2)
    assert limiter.share(0) == 1
    assert limiter.share(1) == 2
