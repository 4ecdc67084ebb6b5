"""SemaphoreRunner: a sliding window of at most ``limit`` async units in flight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, final

from sqlalchemy.ext.asyncio import async_sessionmaker

from .._arguments import ErrorsMode
from .._autolimit import AutoLimit
from .._batch import BatchPolicy
from .._outcome import Outcome
from .._retry import RetryPolicy
from .async_units import AsyncUnitsRunner


@final
class SemaphoreRunner(AsyncUnitsRunner):
    """
    Run async units in a sliding window: a new unit starts as soon as one finishes.

    Never more than ``limit`` units are in flight across all concurrent :meth:`run`, :meth:`map`,
    :meth:`stream` and :meth:`submit` calls on the same runner, and each holds at most one
    pooled connection, so ``limit`` is a bound on connections.

    Args:
        sessions: The :class:`~sqlalchemy.ext.asyncio.async_sessionmaker` each unit's session
            comes from. It must be bound to one engine.
        limit: Most units in flight at once. Defaults to the pool's capacity,
            ``pool_size + max_overflow``, and above it is a :class:`ValueError`. Required for pools
            without a fixed capacity, such as :class:`~sqlalchemy.pool.NullPool`. ``"auto"`` or an
            :class:`~boundeddb.AutoLimit` lets the runner find it and move it while it works.
            *New in 0.2.0.*
        errors: ``"raise"`` to stop at the first failed unit and raise
            :class:`~boundeddb.RunFailed`, ``"collect"`` to run every unit and report failures
            as outcomes.
        retry: Run units that fail with transient errors again. See :class:`~boundeddb.RetryPolicy`.
        timeout: Seconds each unit attempt may take before it is cancelled and rolled back with
            :class:`~boundeddb.UnitTimeout`.
        reserve: Slots of the limit granted only to calls with ``priority > 0``. *New in 0.2.0.*
            Priority-0 work holds at most ``limit - reserve`` of them, so a request's
            ``submit(unit, priority=1)`` finds a slot free while a bulk run saturates the rest.
            Must be less than the limit. With ``limit="auto"`` the reserve stays out of what
            moves: the limit is the moving share plus the reserve. See :doc:`/how-to/priorities`.
        verify_commits: On PostgreSQL 13 or later, ask the server what became of a unit whose
            COMMIT lost its connection or timed out, rather than report it as
            :attr:`~boundeddb.Outcome.commit_unknown`. *New in 0.2.0.* It costs one more round
            trip per unit, and :doc:`/how-to/verify-commits` says how it works. On other databases
            ``True`` is a :class:`ValueError`.
        on_outcome: Called with the :class:`~boundeddb.Outcome` of every unit of every call,
            :meth:`submit` included, as it settles, on the event loop, before a call's own
            ``on_outcome``. For metrics and logs: what it raises is logged to ``boundeddb.hooks``
            and ignored. See :doc:`/how-to/observe`. *New in 0.2.0.*
        batch: Up to this many units in one transaction, an ``int`` or a
            :class:`~boundeddb.BatchPolicy`. ``None`` or ``1`` for one transaction per unit.
            *New in 0.3.0.* ``limit`` then bounds batches in flight, so connections still.
            A unit is ``ok`` only once its batch committed, and a failing unit never takes the
            others' writes with it. A unit may run more than once. See :doc:`/how-to/batches`.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        *,
        limit: int | Literal["auto"] | AutoLimit | None = None,
        errors: ErrorsMode = "raise",
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        reserve: int = 0,
        verify_commits: bool = False,
        on_outcome: Callable[[Outcome[Any]], object] | None = None,
        batch: int | BatchPolicy | None = None,
    ) -> None:
        super().__init__(sessions, limit, errors, retry, timeout, reserve, verify_commits, on_outcome, batch)
