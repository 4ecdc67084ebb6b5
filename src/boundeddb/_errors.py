"""The whole exception tree of boundeddb, in one place.

::

    Exception
     └── BoundedDBError
          ├── RunFailed               (also an ExceptionGroup of the units' own exceptions)
          ├── LoadFailed              (load() stopped: a refused row with errors="raise", or a failed chunk)
          ├── RowRefused              (why load() rejected a row it found in a set, as the server says it)
          ├── UnitTimeout             (also a TimeoutError)
          ├── UnitMisuseError         (also a TypeError)
          ├── RunnerClosedError       (also a RuntimeError)
          ├── RunnerBusyElsewhereError (also a RuntimeError)
          ├── WorkerLostError         (also a RuntimeError; ProcessRunner)
          ├── WorkerStartError        (also a RuntimeError; ProcessRunner)
          └── UnpicklableError        (also a TypeError; ProcessRunner)

Bad arguments raise the builtin :class:`TypeError` or :class:`ValueError`.
A unit's own exception is never wrapped: :meth:`~boundeddb.SemaphoreRunner.submit` raises it unchanged,
a run collects it into :class:`RunFailed` or into :attr:`Outcome.error <boundeddb.Outcome.error>`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import ExceptionGroup

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._outcome import LoadReport, RunReport

__all__ = [
    "BoundedDBError",
    "LoadFailed",
    "RowRefused",
    "RunFailed",
    "RunnerBusyElsewhereError",
    "RunnerClosedError",
    "UnitMisuseError",
    "UnitTimeout",
    "UnpicklableError",
    "WorkerLostError",
    "WorkerStartError",
]


class BoundedDBError(Exception):
    """
    The root of every exception that boundeddb itself raises.

    .. versionadded:: 0.1.0
    """


class RunFailed(ExceptionGroup[Exception], BoundedDBError):
    """
    One or more units of a run failed and the runner was asked to raise, with ``errors="raise"``.

    It is an :class:`ExceptionGroup` of each failed unit's own exception, in input order,
    so ``except* IntegrityError:`` catches the units that hit a constraint.
    :attr:`RunFailed.report` is the partial :class:`~boundeddb.RunReport`.
    Every unit in it either committed or failed and was rolled back.
    Units after the last index in it were never started.

    .. versionadded:: 0.1.0
    """

    #: The partial report of the run that failed.
    report: RunReport[Any]

    def __new__(cls, message: str, exceptions: Sequence[Exception], *, report: RunReport[Any]) -> Self:
        self = super().__new__(cls, message, exceptions)
        self.report = report
        return self

    def __init__(self, message: str, exceptions: Sequence[Exception], *, report: RunReport[Any]) -> None:
        super().__init__(message, exceptions)

    def derive(self, excs: Sequence[Exception]) -> RunFailed:  # type: ignore[override]
        """Keep the type and the report when ``except*`` splits the group."""
        return RunFailed(self.message, excs, report=self.report)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_run_failed, (self.message, list(self.exceptions), self.report))


def _rebuild_run_failed(message: str, exceptions: Sequence[Exception], report: RunReport[Any]) -> RunFailed:
    return RunFailed(message, exceptions, report=report)


class LoadFailed(BoundedDBError):
    """
    A :meth:`~boundeddb.SemaphoreRunner.load` stopped before its end; its :attr:`report` says what committed.

    It stops at the first refused row with ``errors="raise"`` (that row is in ``report.rejected``),
    at a chunk whose transaction failed for any other reason, such as a lost connection once
    retries ran out, a timeout or a COMMIT whose fate is unknown, and before its first chunk if the
    :class:`~boundeddb.Journal`'s lookup failed once retries ran out. The exception that stopped it
    is its ``__cause__``. Rows of chunks that committed before stay committed; rerun with the same
    :class:`~boundeddb.Journal` to load only the rest.

    .. versionadded:: 0.3.0
    """

    def __init__(self, message: str, *, report: LoadReport) -> None:
        super().__init__(message)
        #: What the load committed, skipped and rejected before it stopped.
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_failed, (self.args[0], self.report))


def _load_failed(message: str, report: LoadReport) -> LoadFailed:
    return LoadFailed(message, report=report)


class RowRefused(BoundedDBError):
    """
    Why :meth:`~boundeddb.SemaphoreRunner.load` rejected a row that it found refused in a set, not by
    sending it alone: the ``orig`` of the row's :class:`~sqlalchemy.exc.IntegrityError`, in place of the
    driver's error, with what the server would have said.

    Its first line and its ``DETAIL`` read as the server's message; ``sqlstate`` (also ``pgcode``, as
    psycopg2 names it) and ``constraint_name`` (also ``diag.constraint_name``, as psycopg names it)
    are the server's. Today: a row whose foreign key names no row on PostgreSQL
    ("Rows that miss a parent" in the loads explanation).

    .. versionadded:: 0.4.0
    """

    #: The server's SQLSTATE for the refusal, such as ``"23503"`` (foreign_key_violation).
    sqlstate: str
    #: The constraint that refused the row, as the database names it.
    constraint_name: str
    #: The table the row was for.
    table_name: str
    #: The refused key and its value, as the server's ``DETAIL`` gives them.
    detail: str

    def __init__(
        self, message: str, *, sqlstate: str, constraint_name: str, table_name: str, detail: str
    ) -> None:
        super().__init__(f"{message}\nDETAIL:  {detail}")
        self.sqlstate = sqlstate
        self.constraint_name = constraint_name
        self.table_name = table_name
        self.detail = detail
        self._message = message

    @property
    def pgcode(self) -> str:
        """``sqlstate``, under psycopg2's name."""
        return self.sqlstate

    @property
    def diag(self) -> RowRefused:
        """This error, under psycopg's name for its diagnostics (``diag.constraint_name``)."""
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self._message, self.sqlstate, self.constraint_name, self.table_name, self.detail)
        return (_row_refused, fields)


def _row_refused(message: str, sqlstate: str, constraint: str, table: str, detail: str) -> RowRefused:
    return RowRefused(message, sqlstate=sqlstate, constraint_name=constraint, table_name=table, detail=detail)


class UnitTimeout(BoundedDBError, TimeoutError):
    """
    A unit attempt ran longer than the runner's ``timeout``.

    Its transaction was rolled back.
    On the async runners the unit was cancelled. :class:`~boundeddb.ThreadOffloadRunner`
    cannot kill a thread, so on PostgreSQL the server stopped the statement at its
    ``statement_timeout``, and elsewhere the unit ran to its end and was rolled back.
    The server's error, if there was one, is the ``__cause__``.

    .. versionadded:: 0.1.0
    """

    def __init__(self, index: int, timeout: float) -> None:
        super().__init__(f"unit {index} did not finish within timeout={timeout!r} s")
        self.index = index
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.index, self.timeout))


class UnitMisuseError(BoundedDBError, TypeError):
    """
    A unit broke the unit contract: the error names the unit and the fix.

    A unit breaks it when it is not callable, when it is of the wrong kind for the runner, or when it
    ends the runner's transaction itself. The wrong kind is an ``async def`` for
    :class:`~boundeddb.ThreadOffloadRunner`, or a plain function for an async runner. Ending the
    transaction is calling ``session.commit()``, ``rollback()`` or ``close()`` inside the unit:
    the runner owns the transaction, and cannot promise "all or nothing" for a unit that
    commits part of its work on its own.

    With ``errors="raise"`` the run stops and this error is raised once the units in flight
    finish. With ``errors="collect"`` it is the unit's :attr:`Outcome.error <boundeddb.Outcome.error>`
    and the other units run. A list of units is checked before any database work, and a bad one
    is raised at once whatever ``errors`` says.

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.2.0
       With ``errors="collect"``, a unit's misuse is its outcome instead of stopping the run.
    """


class RunnerClosedError(BoundedDBError, RuntimeError):
    """
    Work was given to a runner after :meth:`~boundeddb.SemaphoreRunner.aclose`.

    .. versionadded:: 0.1.0
    """


class RunnerBusyElsewhereError(BoundedDBError, RuntimeError):
    """
    A runner with units in flight on one event loop was used from another event loop.

    A runner's limit is enforced by primitives of one event loop at a time.
    Create one runner per event loop, or per thread calling
    :meth:`~boundeddb.ThreadOffloadRunner.run_sync`, sharing the engine if you like.

    .. versionadded:: 0.1.0
    """


class WorkerLostError(BoundedDBError, RuntimeError):
    """
    The worker process running a unit of a :class:`~boundeddb.ProcessRunner` died.

    The unit's transaction died with the process's connection, unless its COMMIT had been sent.
    Then :attr:`Outcome.commit_unknown <boundeddb.Outcome.commit_unknown>` is set, or, with
    ``verify_commits=True``, the runner asked the server and the outcome says what it answered.
    Units the worker had been handed but not started ran on another worker instead.

    .. versionadded:: 0.2.0
    """


class WorkerStartError(BoundedDBError, RuntimeError):
    """
    A :class:`~boundeddb.ProcessRunner` could not start its worker processes.

    Raised by a call when a worker exits before it is ready, again and again. The ``__cause__``
    or the message says why. Often it is a main module without an ``if __name__ == "__main__":``
    guard, or a package the workers cannot import.

    .. versionadded:: 0.2.0
    """


class UnpicklableError(BoundedDBError, TypeError):
    """
    A unit's item, value or exception could not be pickled to cross the process boundary of a
    :class:`~boundeddb.ProcessRunner`.

    An item that cannot be pickled is never started. A value that cannot be pickled fails the unit
    before its COMMIT, so it is rolled back. An exception that cannot be pickled is replaced by
    this error, whose message names the original's type and text.

    .. versionadded:: 0.2.0
    """
