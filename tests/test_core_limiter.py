"""The Limiter in memory: who gets a freed slot, limits that move, and reads from other threads."""

from __future__ import annotations

import asyncio
import threading

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import pytest
from anyio import wait_all_tasks_blocked

from boundeddb._core.limiter import Limiter, LimiterStatistics, Slot

pytestmark = [pytest.mark.anyio]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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
        assert limiter.statistics() == LimiterStatistics(limit=3, in_flight=3, waiting=1)
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
        for _ in range(5):
            limiter.release()
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
        limiter.release()
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


async def _take_in_scope(order: Order, name: str, scope: anyio.CancelScope) -> None:
    with scope:
        await order.take(name)


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
        assert limiter.statistics() == LimiterStatistics(limit=3, in_flight=3, waiting=1)
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
    broken: list[LimiterStatistics] = []

    def read() -> int:
        reads = 0
        while not stop.is_set():
            stats = limiter.statistics()
            limiter.should_yield()
            if not 0 <= stats.in_flight <= stats.limit or stats.waiting < 0:
                broken.append(stats)
            reads += 1
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
