"""
Concurrent ``submit()`` calls of a ``batch=`` runner, gathered into shared batches.

Each call puts its unit in the queue of its priority and waits for its own outcome. One waiting call
at a time leads: it waits up to ``linger`` for the queue to fill, but never above priority 0, then for a
slot of the runner's limiter, takes up to ``size`` units, hands the lead to the next waiting call,
and runs the units it took as one batch on that slot. So several batches of one queue are in flight
at once, each under the runner's limit, and while every slot is busy the queue fills: the busier
the runner, the fuller its batches, also with ``linger=0``.

A call cancelled before its unit was taken withdraws it: it never runs. A call cancelled while its
batch runs withdraws its unit too: the batch fails before its COMMIT, and ``batches.py`` runs the
other units again without it. A leader cancelled while its batch runs rolls that batch back, as any
cancelled run does, and puts the other callers' units back at the head of the queue, where the next
leader takes them: they are not lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from .limiter import Limiter, Slot

if TYPE_CHECKING:
    from .._outcome import Outcome

    #: Runs the units at ``priority`` as one batch on the slot, handing each outcome, indexed by
    #: position, to the callback as it settles. The positions in the set are withdrawn meanwhile.
    #: Only for the type checker: ``Outcome[Any]`` built at import would name ``Outcome`` by its
    #: private module in the runners' signatures that Sphinx shows.
    RunBatch = Callable[[list[Any], int, Callable[[Outcome[Any]], None], Slot, set[int]], Awaitable[None]]

__all__ = ["Gather", "TakenSlot"]


class TakenSlot(Slot):
    """A slot its leader took before the batch's run began: the run's first ``take()`` is that one."""

    __slots__ = ()

    async def take(self) -> None:
        if not self.held:
            await super().take()


class _Call:
    """One waiting ``submit()``."""

    __slots__ = ("outcome", "position", "taken", "unit", "withdrawn", "woken")

    def __init__(self, unit: Any) -> None:
        self.unit = unit
        self.outcome: Outcome[Any] | None = None
        #: In a batch that runs now or ran: no longer in the queue.
        self.taken = False
        #: Once taken: its position in its batch, and the batch's set of withdrawn positions.
        self.position = -1
        self.withdrawn: set[int] = set()
        self.woken = anyio.Event()

    def wake(self) -> None:
        self.woken.set()


class _Queue:
    """The calls of one priority that wait to be taken into a batch, and who leads them."""

    __slots__ = ("calls", "filled", "leader")

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self.leader: _Call | None = None
        #: Set when the leader should stop lingering: the queue holds a full batch, or closing.
        self.filled = anyio.Event()

    def hand_over(self) -> None:
        """The lead is free: wake the first waiting call to take it."""
        if self.leader is None and self.calls:
            self.calls[0].wake()


class Gather:
    """A runner's ``submit()`` calls in batches of up to ``size``, lingering up to ``linger`` seconds."""

    def __init__(self, size: int, linger: float, limiter: Limiter, run_batch: RunBatch) -> None:
        self._size = size
        self._limiter = limiter
        self._linger = linger
        self._run_batch = run_batch
        self._queues: dict[int, _Queue] = {}
        self._closing = False

    async def submit(self, unit: Any, priority: int) -> Outcome[Any]:
        """Run ``unit`` in a batch with other calls' units, and return its own outcome."""
        queue = self._queues.get(priority)
        if queue is None:
            queue = self._queues[priority] = _Queue()
        call = _Call(unit)
        queue.calls.append(call)
        if len(queue.calls) >= self._size:
            queue.filled.set()
        try:
            while call.outcome is None:
                if not call.taken and queue.leader is None:
                    await self._lead(queue, priority, call)
                else:
                    if call.woken.is_set():
                        call.woken = anyio.Event()
                    await call.woken.wait()
        except BaseException:
            if not call.taken:
                queue.calls.remove(call)  # never started: it never runs
                queue.hand_over()
            elif call.outcome is None:  # its batch runs: it fails the batch before the COMMIT
                call.withdrawn.add(call.position)
            raise
        return call.outcome

    def close(self) -> None:
        """Start every waiting batch now: nothing submitted lingers once the runner closes."""
        self._closing = True
        for queue in self._queues.values():
            queue.filled.set()

    async def _lead(self, queue: _Queue, priority: int, me: _Call) -> None:
        queue.leader = me
        slot = TakenSlot(self._limiter, priority)
        try:
            if priority <= 0 and self._linger > 0:
                with anyio.move_on_after(self._linger):
                    while len(queue.calls) < self._size and not self._closing:
                        if queue.filled.is_set():
                            queue.filled = anyio.Event()
                        await queue.filled.wait()
            await slot.take()  # meanwhile, more calls may queue: they join this batch
            taken = queue.calls[: self._size]
            del queue.calls[: self._size]
            withdrawn: set[int] = set()
            for position, call in enumerate(taken):
                call.taken, call.position, call.withdrawn = True, position, withdrawn
        except BaseException:
            slot.give()
            raise
        finally:
            queue.leader = None
            queue.hand_over()

        def settled(outcome: Outcome[Any]) -> None:
            taken[outcome.index].outcome = outcome

        try:
            await self._run_batch([call.unit for call in taken], priority, settled, slot, withdrawn)
        finally:
            slot.give()  # if the run never began
            unsettled = [call for call in taken if call.outcome is None and call is not me]
            for call in unsettled:  # the leader was cancelled: back to the head of the queue
                call.taken = False
            queue.calls[:0] = unsettled
            for call in taken:
                call.wake()
            queue.hand_over()
