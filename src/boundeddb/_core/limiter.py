"""
The Limiter: the one object that grants slots and takes them back.

A slot is the right to hold one connection for one unit. Every runner has one limiter, shared by
all its calls (batches, streams, submits): that is what makes ``limit`` a bound on connections.

- Slots go to the waiter with the highest priority first, first come first served within one.
- The limit may change while slots are held (:meth:`Limiter.set_limit`): raising it grants
  waiters at once; lowering it grants nothing more, and the limit steps down only as slots come
  back, so that at every moment ``in_flight <= limit``.
- :meth:`Limiter.acquire` and :meth:`Limiter.release` belong to the event loop the runner is bound
  to (a waiter is that loop's event); the figures (``limit``, ``in_flight``, :meth:`statistics`,
  :meth:`should_yield`) may be read from any thread: worker threads never touch an anyio primitive.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading

import anyio

__all__ = ["Limiter", "LimiterStatistics", "Slot"]


@dataclasses.dataclass(frozen=True, slots=True)
class LimiterStatistics:
    """A snapshot of a limiter (anyio's ``*Statistics`` style)."""

    limit: int
    in_flight: int
    waiting: int


class _Waiter:
    __slots__ = ("event", "granted", "priority")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.event = anyio.Event()
        self.granted = False


class Limiter:
    """Grants at most ``limit`` slots at once, by priority; see the module docstring."""

    def __init__(self, limit: int) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._target = limit
        self._in_flight = 0
        # (-priority, arrival, waiter); a waiter that gave up stays in the heap, ungranted and
        # marked by ``_gone``, until it reaches the top.
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
    def in_flight(self) -> int:
        """Slots held right now."""
        return self._in_flight

    def statistics(self) -> LimiterStatistics:
        with self._lock:
            return LimiterStatistics(self._limit, self._in_flight, len(self._heap) - len(self._gone))

    def should_yield(self) -> bool:
        """Whether a holder that could go on should give its slot back (someone waits, or over limit)."""
        with self._lock:
            return len(self._heap) > len(self._gone) or self._in_flight > self._target

    def try_acquire(self, priority: int = 0) -> bool:
        """Take a slot if one is free and nobody of the same or a higher priority waits for it."""
        with self._lock:
            if self._in_flight < self._limit and not self._ahead(priority):
                self._in_flight += 1
                return True
            return False

    async def acquire(self, priority: int = 0) -> None:
        """Take a slot, waiting for one if none is free (no trip through the loop if one is)."""
        if self.try_acquire(priority):
            return
        waiter = _Waiter(priority)
        with self._lock:
            # Checked again under the lock: a slot may have come back meanwhile.
            if self._in_flight < self._limit and not self._ahead(priority):
                self._in_flight += 1
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
                self.release()
            raise

    def release(self) -> None:
        """Give a slot back; wake the waiters that may have one now (on the limiter's loop)."""
        with self._lock:
            self._in_flight -= 1
            if self._limit > self._target:
                self._limit = max(self._target, self._in_flight)
            woken = self._grant()
        for waiter in woken:
            waiter.event.set()

    def set_limit(self, limit: int) -> None:
        """Move the limit to ``limit`` (>= 1): up at once, down as slots come back (on the loop)."""
        with self._lock:
            self._target = limit
            self._limit = limit if limit >= self._limit else max(limit, self._in_flight)
            woken = self._grant()
        for waiter in woken:
            waiter.event.set()

    def _ahead(self, priority: int) -> bool:
        """Whether a live waiter of ``priority`` or higher is queued (under the lock)."""
        heap = self._heap
        while heap and heap[0][2] in self._gone:
            self._gone.discard(heapq.heappop(heap)[2])
        return bool(heap) and -heap[0][0] >= priority

    def _grant(self) -> list[_Waiter]:
        """Hand free slots to the waiters at the head of the queue (under the lock)."""
        woken: list[_Waiter] = []
        heap = self._heap
        while heap and self._in_flight < self._limit:
            waiter = heapq.heappop(heap)[2]
            if waiter in self._gone:
                self._gone.discard(waiter)
                continue
            waiter.granted = True
            self._in_flight += 1
            woken.append(waiter)
        return woken


class Slot:
    """One worker's hold on a limiter: taken before each unit, given back after it (or to back off)."""

    __slots__ = ("held", "limiter", "priority")

    def __init__(self, limiter: Limiter, priority: int = 0) -> None:
        self.limiter = limiter
        self.priority = priority
        self.held = False

    async def take(self) -> None:
        await self.limiter.acquire(self.priority)
        self.held = True

    def give(self) -> None:
        """Give the slot back if it is held (so clean-up can call it blindly)."""
        if self.held:
            self.held = False
            self.limiter.release()
