"""
The results a runner hands back: what became of each unit, and of a whole run.

An :class:`Outcome` is one unit's, and a :class:`RunReport` a run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic

from ._typevars import T

if TYPE_CHECKING:
    from ._stats import RunStats

__all__ = ["ChunkResult", "LoadReport", "Outcome", "RejectedRow", "RunReport"]


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """
    What became of one unit: its value if it committed, its exception if it failed.

    Outcomes are values: frozen, comparable, and safe to keep after the runner is closed.

    .. versionadded:: 0.1.0
    """

    #: The unit's position in the input, from 0.
    index: int
    #: The unit's return value if it committed, else ``None``.
    value: T | None
    #: The exception of the unit's last attempt if it failed and its transaction was rolled back,
    #: else ``None``.
    error: Exception | None
    #: Seconds the unit's last attempt ran, from opening its session to closing it.
    latency_s: float
    #: Seconds the unit waited for a free slot before it started, summed over its attempts.
    wait_s: float
    #: How many attempts it took. More than 1 only with a retry policy.
    attempts: int = 1
    #: ``True`` if the unit failed *while the runner was committing it* and the failure leaves
    #: the commit's fate unknown: the connection was lost, or the unit was cancelled or timed out
    #: mid-commit, and the transaction may have committed. Such a unit is never retried. Give units
    #: a unique key or another idempotency check, and look it up to learn what happened.
    #: With ``verify_commits=True`` on PostgreSQL the runner asks the server first, and sets it only
    #: if no answer came within its wait.
    commit_unknown: bool = False
    #: ``True`` if the connection was lost while the runner committed the unit's last attempt and,
    #: with ``verify_commits=True``, the runner learned from the server what became of it: the unit
    #: is ``ok`` if the server committed it, else it failed with that COMMIT's error and nothing
    #: of it was committed. After a retry policy ran it again, this describes the last attempt.
    #:
    #: .. versionadded:: 0.2.0
    commit_verified: bool = False
    #: ``True`` if the unit did not run because its :class:`~boundeddb.Journal` row says an earlier
    #: run committed it. It is ``ok``, with no value and ``attempts == 0``.
    #:
    #: .. versionadded:: 0.3.0
    skipped: bool = False

    @property
    def ok(self) -> bool:
        """``True`` if the unit returned and its transaction committed."""
        return self.error is None

    def unwrap(self) -> T:
        """
        Return the value, or raise the unit's own exception.

        Raises:
            Exception: the unit's exception, unchanged, if it failed.
        """
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


_new = object.__new__
(
    _SET_INDEX,
    _SET_VALUE,
    _SET_ERROR,
    _SET_LATENCY,
    _SET_WAIT,
    _SET_ATTEMPTS,
    _SET_UNKNOWN,
    _SET_VERIFIED,
    _SET_SKIPPED,
) = (Outcome.__dict__[field.name].__set__ for field in dataclasses.fields(Outcome))


def committed_outcome(
    index: int, value: object, latency_s: float, wait_s: float, attempts: int = 1, verified: bool = False
) -> Outcome[object]:
    """
    ``Outcome(index, value, None, latency_s, wait_s, attempts, commit_verified=verified)``, made
    without the frozen dataclass's ``__init__``: its ``object.__setattr__`` per field cost the per-unit
    path about 0.7 µs of every unit that commits.
    """
    outcome: Outcome[object] = _new(Outcome)
    _SET_INDEX(outcome, index)
    _SET_VALUE(outcome, value)
    _SET_ERROR(outcome, None)
    _SET_LATENCY(outcome, latency_s)
    _SET_WAIT(outcome, wait_s)
    _SET_ATTEMPTS(outcome, attempts)
    _SET_UNKNOWN(outcome, False)
    _SET_VERIFIED(outcome, verified)
    _SET_SKIPPED(outcome, False)
    return outcome


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class RunReport(Generic[T]):
    """
    Everything a run, ``run()`` or ``map()``, did, in input order.

    Every unit the runner pulled from the input has an outcome here:
    it committed and is ``ok``, or it failed and was rolled back,
    or, rarely, it failed during the commit itself with
    :attr:`~boundeddb.Outcome.commit_unknown` set.
    Units never pulled, after a failure with ``errors="raise"``, have none.

    .. versionadded:: 0.1.0
    """

    #: One outcome per started unit, in input order: ``outcomes[i].index == i``.
    outcomes: Sequence[Outcome[T]]
    #: Figures for the whole run.
    stats: RunStats

    def __repr__(self) -> str:
        # Short whatever the number of outcomes: Python 3.11's asyncio.Runner.run takes the repr of
        # the main task's result, twice, and so do anyio.run, run_sync() and map_sync().
        failed = sum(1 for outcome in self.outcomes if outcome.error is not None)
        outcomes = f"<{len(self.outcomes)} outcomes, {failed} failed>"
        return f"{type(self).__name__}(outcomes={outcomes}, stats={self.stats!r})"

    def values(self) -> list[T]:
        """
        Return the units' values in input order.

        Raises:
            Exception: the first failed unit's own exception, if any unit failed.
        """
        return [outcome.unwrap() for outcome in self.outcomes]

    @property
    def failures(self) -> list[Outcome[T]]:
        """The outcomes of the units that failed, in input order."""
        return [outcome for outcome in self.outcomes if outcome.error is not None]


class ChunkResult:
    """What a chunk's transaction committed: how many rows, and which it rejected."""

    __slots__ = ("loaded", "rejected", "sent")

    def __init__(self, loaded: int, rejected: list[RejectedRow], sent: int) -> None:
        self.loaded = loaded
        self.rejected = rejected
        #: Rows sent to the database over all attempts: ``loaded`` when none was refused.
        self.sent = sent


@dataclasses.dataclass(frozen=True, slots=True)
class RejectedRow:
    """
    A row that :meth:`~boundeddb.SemaphoreRunner.load` did not write, because the database refused it.

    .. versionadded:: 0.3.0
    """

    #: The row's position in the input, from 0.
    index: int
    #: The row as the input gave it.
    row: object
    #: Why the database refused it: the SQLAlchemy exception that ``insert()`` would raise for it,
    #: such as :class:`~sqlalchemy.exc.IntegrityError`, wrapping the driver's with its SQLSTATE or
    #: error number.
    error: Exception


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class LoadReport:
    """
    What a :meth:`~boundeddb.SemaphoreRunner.load` wrote: rows committed, skipped and rejected.

    .. versionadded:: 0.3.0
    """

    #: Rows committed by this call.
    loaded: int
    #: Rows not written because the :class:`~boundeddb.Journal` says an earlier call committed them.
    skipped: int
    #: Each row the database refused, in input order. None of them was written.
    rejected: Sequence[RejectedRow]
    #: Transactions committed: one per chunk of up to ``batch`` rows.
    transactions: int
    #: Figures for the whole call; its units are the chunks.
    stats: RunStats

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(loaded={self.loaded}, skipped={self.skipped}, "
            f"rejected=<{len(self.rejected)} rows>, transactions={self.transactions})"
        )
