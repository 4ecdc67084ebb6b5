"""
The Limiter: the one object that grants slots and takes them back.

A slot is the right to hold one connection for one unit. Every runner has one limiter, shared by
all its calls, so ``limit`` bounds the runner's connections. Invariants:

- ``in_flight <= limit`` at every moment, also while the limit moves. A raised limit grants
  waiters at once, and a lowered one grants nothing more and steps down as slots come back.
- A freed slot goes to the waiter of the highest priority, first come first served within one.
- Work of priority 0 or below holds at most ``limit - reserve`` slots. A reserved slot is never
  lent, not even while it sits idle.
- :meth:`Limiter.acquire` and :meth:`Limiter.release` belong to the runner's event loop. Any
  thread may read the figures: ``limit``, ``in_flight``, :meth:`~Limiter.statistics` and
  :meth:`~Limiter.should_yield`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import types
from collections import Counter

import anyio

from .._stats import RunnerStatistics

__all__ = ["Limiter", "Slot"]


class _Waiter:
    __slots__ = ("event", "granted", "priority")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.event = anyio.Event()
        self.granted = False


class Limiter:
    """Grants at most ``limit`` slots at once, by priority, ``reserve`` of them above priority 0."""

    def __init__(self, limit: int, reserve: int = 0) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._target = limit
        self._reserve = reserve
        self._in_flight = 0
        #: Slots held by priority 0 and below: the work the reserve is kept from.
        self._shared = 0
        self._held: Counter[int] = Counter()
        # Entries are ``(-priority, arrival, waiter)``. A waiter that gave up stays in the heap,
        # ungranted and marked by ``_gone``, until it reaches the top.
        self._heap: list[tuple[int, int, _Waiter]] = []
        self._gone: set[_Waiter] = set()
        self._arrivals = itertools.count()

    @property
    def limit(self) -> int:
        """The most slots granted at once, now."""
        return self._limit

    @property
    def target(self) -> int:
        """Where the limit is going: :attr:`limit` once enough slots have come back."""
        return self._target

    @property
    def reserve(self) -> int:
        """Slots granted only to priorities above 0."""
        return self._reserve

    @property
    def in_flight(self) -> int:
        """Slots held right now."""
        return self._in_flight

    def share(self, priority: int, limit: int | None = None) -> int:
        """The most slots work of ``priority`` may hold at once under ``limit``, by default the limit now."""
        limit = self._limit if limit is None else limit
        return limit if priority > 0 else limit - self._reserve

    def statistics(self) -> RunnerStatistics:
        """A snapshot: the limit, the reserve, and the slots held and waited for, by priority."""
        with self._lock:
            waiting = Counter(-key for key, _, waiter in self._heap if waiter not in self._gone)
            held = {priority: n for priority, n in self._held.items() if n}
            return RunnerStatistics(
                limit=self._limit,
                reserve=self._reserve,
                in_flight=self._in_flight,
                waiting=waiting.total(),
                waiting_by_priority=types.MappingProxyType(dict(sorted(waiting.items()))),
                in_flight_by_priority=types.MappingProxyType(dict(sorted(held.items()))),
            )

    def should_yield(self) -> bool:
        """Whether a holder that could go on should give its slot back: someone waits, or over the limit."""
        with self._lock:
            return (
                len(self._heap) > len(self._gone)
                or self._in_flight > self._target
                or self._shared > self._target - self._reserve
            )

    def try_acquire(self, priority: int = 0) -> bool:
        """Take a slot if one is free and nobody of the same or a higher priority waits for it."""
        with self._lock:
            if self._free_for(priority) and not self._ahead(priority):
                self._take(priority)
                return True
            return False

    async def acquire(self, priority: int = 0) -> None:
        """Take a slot, waiting for one if none is free. A free one costs no trip through the loop."""
        if self.try_acquire(priority):
            return
        waiter = _Waiter(priority)
        with self._lock:
            # Checked again under the lock: a slot may have come back meanwhile.
            if self._free_for(priority) and not self._ahead(priority):
                self._take(priority)
                return
            heapq.heappush(self._heap, (-priority, next(self._arrivals), waiter))
        try:
            await waiter.event.wait()
        except BaseException:
            with self._lock:
                granted = waiter.granted
                if not granted:
                    self._gone.add(waiter)
            if granted:  # the slot came as the waiter was cancelled: pass it on
                self.release(priority)
            raise

    def release(self, priority: int = 0) -> None:
        """Give back a slot taken at ``priority``, and wake the waiters that may have one now. On the loop."""
        with self._lock:
            self._in_flight -= 1
            self._held[priority] -= 1
            if priority <= 0:
                self._shared -= 1
            if self._limit > self._target:
                self._limit = max(self._target, self._in_flight)
            woken = self._grant()
        for waiter in woken:
            waiter.event.set()

    def set_limit(self, limit: int) -> None:
        """Move the limit to ``limit``, at least 1: up at once, down as slots come back. On the loop."""
        with self._lock:
            self._target = limit
            self._limit = limit if limit >= self._limit else max(limit, self._in_flight)
            woken = self._grant()
        for waiter in woken:
            waiter.event.set()

    def _free_for(self, priority: int) -> bool:
        """Whether a slot is free for ``priority``: under the limit, and outside the reserve if <= 0."""
        if priority > 0:
            return self._in_flight < self._limit
        return self._in_flight < self._limit and self._shared < self._limit - self._reserve

    def _take(self, priority: int) -> None:
        self._in_flight += 1
        self._held[priority] += 1
        if priority <= 0:
            self._shared += 1

    def _ahead(self, priority: int) -> bool:
        """Whether a live waiter of ``priority`` or higher is queued. Call it under the lock."""
        heap = self._heap
        while heap and heap[0][2] in self._gone:
            self._gone.discard(heapq.heappop(heap)[2])
        return bool(heap) and -heap[0][0] >= priority

    def _grant(self) -> list[_Waiter]:
        """Hand free slots to the waiters at the head of the queue. Call it under the lock."""
        woken: list[_Waiter] = []
        heap = self._heap
        while heap:
            waiter = heap[0][2]
            if waiter in self._gone:
                heapq.heappop(heap)
                self._gone.discard(waiter)
                continue
            # The head has the highest priority: if no slot is free for it, none is for those behind.
            if not self._free_for(waiter.priority):
                break
            heapq.heappop(heap)
            waiter.granted = True
            self._take(waiter.priority)
            woken.append(waiter)
        return woken


class Slot:
    """One worker's hold on a limiter: taken before each unit, given back after it or to back off."""

    __slots__ = ("held", "limiter", "priority")

    def __init__(self, limiter: Limiter, priority: int = 0) -> None:
        self.limiter = limiter
        self.priority = priority
        self.held = False

    async def take(self) -> None:
        await self.limiter.acquire(self.priority)
        self.held = True

    def give(self) -> None:
        """Give the slot back if it is held, so that clean-up can call it blindly."""
        if self.held:
            self.held = False
            self.limiter.release(self.priority)
