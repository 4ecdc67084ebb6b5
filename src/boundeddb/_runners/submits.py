"""
The ``submit()`` path of the in-process runners: one unit, run alone or in a batch with other calls' units.

:func:`submit_unit` is a method of :class:`~boundeddb._runners.base.BaseRunner`, which binds it as
``_submit_unit``, and :func:`gather_for` builds the runner's :class:`~boundeddb._core.gather.Gather`
for ``batch=``. ``base.py`` imports this module, so :class:`Submitter` names what they read of the
runner rather than importing it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from .._arguments import check_priority
from .._batch import BatchPolicy
from .._core.adaptive import LimitController
from .._core.attempts import Attempts
from .._core.feedback import tell_cancelled
from .._core.gather import Gather
from .._core.limiter import Limiter, Slot
from .._core.pacing import IN_PLACE, Executor, drive
from .._core.recorder import NullRecorder
from .._core.run import Run, SinkT
from .._core.sinks import CallbackSink, ValueSink
from .._core.withdrawals import Withdrawals
from .._outcome import Outcome
from .._progress import check_on_outcome
from .items import check_now
from .observers import Observers

__all__ = ["Submitter", "gather_for", "run_gathered", "submit_unit"]

_NULL_RECORDER = NullRecorder()


class Submitter(Protocol):
    """What the ``submit()`` path reads of its runner, a :class:`~boundeddb._runners.base.BaseRunner`."""

    _engine: Engine
    _executor: Executor[Any]
    _attempts: Attempts
    _limiter: Limiter
    _observers: Observers
    _controller: LimitController | None
    _gather: Gather | None

    def _bound(self) -> AbstractContextManager[None]: ...

    def _new_run(
        self,
        units: list[Any],
        sink: SinkT,
        recorder: NullRecorder,
        *,
        priority: int,
        stop_on_failure: bool,
    ) -> Run[SinkT]: ...

    async def _drive(self, run: Run[Any], *, adapt: bool, workers: int = ..., slot: Slot = ...) -> None: ...


async def submit_unit(runner: Submitter, unit: Any, priority: object, on_outcome: object = None) -> Any:
    """
    One ``submit()`` call: the unit's value, or its own exception raised.

    With ``batch=``, the unit waits in ``runner._gather`` to share a batch with other calls' units.
    A call cancelled once its unit had settled, or had begun to commit, tells ``on_outcome`` what
    became of the unit before the cancellation goes on; one cancelled before never commits.
    """
    priority = check_priority(priority)
    hook = check_on_outcome(on_outcome)
    check_now(unit, 0, runner._executor.check)
    with runner._bound():
        if runner._gather is not None:  # batch=: the unit shares a batch with other calls' units
            outcome = await runner._gather.submit(unit, priority, hook)
        else:
            sink = ValueSink()
            run = runner._new_run([unit], sink, _NULL_RECORDER, stop_on_failure=True, priority=priority)
            try:
                await drive(run, runner._executor, runner._attempts, IN_PLACE, runner._limiter, 1, alone=True)
            except BaseException:
                if sink.outcome is not None:  # it settled (its COMMIT let finish) before the run stopped
                    _settled_though_cancelled(runner, run, sink.outcome, hook)
                raise
            run.serve_hook()  # the runner's own on_outcome
            assert sink.outcome is not None
            outcome = sink.outcome
            runner._observers.totals.add(outcome)
        if runner._controller is not None:
            runner._controller.adjust()  # no ticker for one unit: look now
    if hook is not None:  # the call's own, after the runner's: what it raises, submit() raises
        hook(outcome)
    return outcome.unwrap()


def _settled_though_cancelled(
    runner: Submitter, run: Run[Any], outcome: Outcome[Any], hook: Callable[[Outcome[Any]], object] | None
) -> None:
    """A lone unit that settled though its ``submit()`` was cancelled: counted, and told to the hooks."""
    run.serve_hook()  # the runner's own, which never raises
    runner._observers.totals.add(outcome)
    if hook is not None:
        tell_cancelled(hook, outcome)


async def run_gathered(
    runner: Submitter,
    units: list[Any],
    priority: int,
    settled: Callable[[Outcome[Any]], None],
    slot: Slot,
    withdrawals: Withdrawals,
) -> None:
    """Run ``submit()`` calls' ``units`` as one batch on ``slot``, for ``_core/gather.py``."""
    with runner._observers.recording(runner._engine.pool, keep_latencies=False) as recorder:
        sink = CallbackSink(settled)
        run = runner._new_run(units, sink, recorder, stop_on_failure=False, priority=priority)
        run.withdrawals = withdrawals
        await runner._drive(run, adapt=False, workers=1, slot=slot)


def gather_for(runner: Submitter, batch: BatchPolicy | None, limiter: Limiter) -> Gather | None:
    """Where ``runner``'s ``submit()`` calls wait to share a batch, or None without ``batch=``."""
    return None if batch is None else Gather(batch.size, batch.linger, limiter, partial(run_gathered, runner))
