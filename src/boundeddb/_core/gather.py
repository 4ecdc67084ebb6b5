"""
Concurrent ``submit()`` calls of a ``batch=`` runner, gathered into shared batches.

Each call puts its unit in the queue of its priority and waits for its own outcome. One waiting call
at a time leads: it waits up to ``linger`` for the queue to fill, but never above priority 0, then for a
slot of the runner's limiter, takes up to ``size`` units, hands the lead to the next waiting call,
and runs the units it took as one batch on that slot. So several batches of one queue are in flight
at once, each under the runner's limit, and while every slot is busy the queue fills: the busier
the runner, the fuller its batches, also with ``linger=0``.

A call cancelled before its unit was taken withdraws it: it never runs. A call cancelled while its
batch runs withdraws its unit too, unless the batch's COMMIT had begun (``withdrawals.py``): the
batch fails before its next unit or its COMMIT, and ``batches.py`` runs the other units again
without it. Once the COMMIT had begun, the unit cannot be taken back: the call waits, shielded, for
its outcome, and tells its ``on_outcome`` hook before the cancellation goes on. A leader cancelled
while its batch runs rolls that batch back, as any cancelled run does (a COMMIT that had begun
finishes), and puts back at the head of the queue only the units of callers that still wait, where
the next leader takes them: they are not lost, and a withdrawn unit never runs again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from .feedback import tell_cancelled
from .limiter import Limiter, Slot
from .withdrawals import NO_WITHDRAWALS, Withdrawals, Withdrawn

if TYPE_CHECKING:
    from .._outcome import Outcome

    #: Runs the units at ``priority`` as one batch on the slot, handing each outcome, indexed by
    #: position, to the callback as it settles. Their callers may withdraw them meanwhile.
    #: Only for the type checker: ``Outcome[Any]`` built at import would name ``Outcome`` by its
    #: private module in the runners' signatures that Sphinx shows.
    RunBatch = Callable[[list[Any], int, Callable[[Outcome[Any]], None], Slot, Withdrawals], Awaitable[None]]
    Hook = Callable[[Outcome[Any]], object]

__all__ = ["Gather", "TakenSlot"]


class TakenSlot(Slot):
    """A slot its leader took before the batch's run began: the run's first ``take()`` is that one."""

    __slots__ = ()

    async def take(self) -> None:
        if not self.held:
            await super().take()


#: Where a call is: in the queue, in a batch that runs, or done with (settled, or given up).
_QUEUED, _TAKEN, _DONE = range(3)


class _Call:
    """One waiting ``submit()``."""

    __slots__ = ("outcome", "position", "state", "unit", "withdrawals", "woken")

    def __init__(self, unit: Any) -> None:
        self.unit = unit
        self.outcome: Outcome[Any] | None = None
        self.state = _QUEUED
        #: Once taken: its position in its batch, and the batch's withdrawals.
        self.position = -1
        self.withdrawals = NO_WITHDRAWALS
        self.woken = anyio.Event()

    def wake(self) -> None:
        """Its outcome settled, its batch ended, or the lead is free."""
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

    async def submit(self, unit: Any, priority: int, hook: Hook | None = None) -> Outcome[Any]:
        """
        Run ``unit`` in a batch with other calls' units, and return its own outcome.

        ``hook``: the call's own ``on_outcome``, told the outcome if the call is cancelled once its
        unit settled, or once its COMMIT had begun (see the module docstring).
        """
        queue = self._queues.get(priority)
        if queue is None:
            queue = self._queues[priority] = _Queue()
        call = _Call(unit)
        queue.calls.append(call)
        if len(queue.calls) >= self._size:
            queue.filled.set()
        try:
            while call.outcome is None:
                if call.state == _QUEUED and queue.leader is None:
                    await self._lead(queue, priority, call)
                else:
                    if call.woken.is_set():
                        call.woken = anyio.Event()
                    await call.woken.wait()
        except BaseException:
            await self._give_up(queue, call, hook)
            raise
        return call.outcome

    @staticmethod
    async def _give_up(queue: _Queue, call: _Call, hook: Hook | None) -> None:
        """``call``'s caller was cancelled: withdraw its unit, or wait for what its COMMIT did."""
        if call.state == _QUEUED:  # never taken: it never runs
            queue.calls.remove(call)
            queue.hand_over()
            return
        if call.outcome is None and call.state == _TAKEN and not call.withdrawals.withdraw(call.position):
            # Its batch's COMMIT had begun: the unit cannot be taken back. Hear what the server did.
            with anyio.CancelScope(shield=True):
                while call.outcome is None and call.state == _TAKEN:
                    if call.woken.is_set():
                        call.woken = anyio.Event()
                    try:
                        await call.woken.wait()
                    except anyio.get_cancelled_exc_class():
                        pass  # a second native cancellation, which no shield stops: the first one goes on
        outcome = call.outcome
        if hook is not None and outcome is not None and not isinstance(outcome.error, Withdrawn):
            tell_cancelled(hook, outcome)

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
            withdrawals = Withdrawals()
            for position, call in enumerate(taken):
                call.state, call.position, call.withdrawals = _TAKEN, position, withdrawals
        except BaseException:
            slot.give()
            raise
        finally:
            queue.leader = None
            queue.hand_over()

        def settled(outcome: Outcome[Any]) -> None:
            call = taken[outcome.index]
            call.outcome = outcome
            call.wake()

        try:
            await self._run_batch([call.unit for call in taken], priority, settled, slot, withdrawals)
        finally:
            slot.give()  # if the run never began
            back: list[_Call] = []
            withdrawn = withdrawals.indexes
            for call in taken:
                if call.outcome is None:  # the leader was cancelled
                    if call is me or call.position in withdrawn:
                        call.state = _DONE  # its caller is gone, or waits to hear of a COMMIT that failed
                    else:
                        call.state = _QUEUED  # its caller waits: back to the head of the queue
                        back.append(call)
                    call.wake()
            queue.calls[:0] = back
            queue.hand_over()
