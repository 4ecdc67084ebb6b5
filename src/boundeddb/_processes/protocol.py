"""
The protocol between a ProcessRunner's parent and its workers: all that crosses the process boundary.

That is a worker's settings, the marks a worker makes of its units, and the messages both ways.
"""

from __future__ import annotations

import dataclasses
import enum
import pickle
import traceback
from collections.abc import Mapping
from typing import Any, NamedTuple

from sqlalchemy.engine import URL

from .._batch import BatchPolicy
from .._errors import UnpicklableError
from .._retry import RetryPolicy

__all__ = [
    "Begun",
    "CallBegins",
    "CallFailed",
    "CallMessage",
    "Cancel",
    "Close",
    "Closed",
    "Committing",
    "Exit",
    "Kind",
    "LookUp",
    "LookedUp",
    "Ready",
    "RemoteTraceback",
    "Returned",
    "Settled",
    "Stop",
    "Units",
    "Verified",
    "Verify",
    "WorkerConfig",
    "dump_error",
    "dump_value",
    "load_error",
    "most_handed",
]


class Kind(enum.Enum):
    """Which session a call's function takes, so which engine and in-process runner a worker uses."""

    ASYNC = "async"  # async def fn(session: AsyncSession, item): SemaphoreRunner in the worker
    SYNC = "sync"  # def fn(session: Session, item): ThreadOffloadRunner in the worker


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to build its engine and runners: plain, picklable data."""

    url: URL
    engine_options: Mapping[str, Any]
    #: This worker's share of the runner's limit: its pool's size and its units in flight, at most.
    share: int
    retry: RetryPolicy | None
    timeout: float | None
    verify_commits: bool
    #: ``batch=``: this worker's runner puts up to ``batch.size`` units in one transaction.
    batch: BatchPolicy | None = None

    @property
    def units(self) -> int:
        """The most units in flight on this worker: its share, or its share of batches."""
        return self.share * (1 if self.batch is None else self.batch.size)


# -- marks: what a worker's units have begun, where the parent reads it when the worker dies -------
# The parent gives each unit it hands to a worker a *place*, an index into the worker's marks that is
# free again once the unit settled or came back, and clears its mark. The worker marks the unit before
# the unit's first statement, and again before its COMMIT. A local worker stores the marks in memory
# it shares with the parent: no message, no system call. The parent reads them only once the
# worker has ended, when they cannot change any more. A Dask worker may be on another host and
# has no shared memory: it sends each mark in a Begun or Committing message instead, in the
# pipe before the step it announces.
MARK_HANDED = 0  # handed, not begun: if the worker dies, the unit runs on another
MARK_BEGUN = 1  # its first statement may have been sent: if the worker dies, the unit failed
MARK_COMMITTING = 2  # its COMMIT may have been sent: if the worker dies, its outcome is unknown


def most_handed(units: int) -> int:
    """
    Units the parent hands a worker with ``units`` in flight at most, so places of its marks.

    Three times as many: the parent refills a worker once no more than ``units`` are left handed to
    it, so each refill is twice ``units``.
    """
    return 3 * units


# -- messages: named records, pickled in lists, one list per write --------------------------------
# Parent to worker.


class CallBegins(NamedTuple):
    """A call's function, before its first units."""

    call: int
    kind: str
    fn: bytes
    #: The caller's trace context, when ``boundeddb.instrument()`` instruments it.
    carrier: dict[str, str] | None
    #: With ``journal=``, ``(job, table)``: each item comes pickled with its key, as ``(item, key)``.
    journal: tuple[str, str] | None = None


class Units(NamedTuple):
    """Units to run, in this order."""

    call: int
    #: ``(index, item pickled, place)`` for each unit.
    units: list[tuple[int, bytes, int]]


class Close(NamedTuple):
    """No more units: finish, then :class:`Closed`."""

    call: int


class Stop(NamedTuple):
    """Start no more units but send them back, finish those in flight, then :class:`Closed`."""

    call: int


class Cancel(NamedTuple):
    """As :class:`Stop`, and cancel the units in flight: they roll back."""

    call: int


class Verify(NamedTuple):
    """Ask the server what became of these COMMITs of a dead worker."""

    kind: str
    #: ``(call, index, transaction id)`` for each COMMIT.
    requests: list[tuple[int, int, str]]


class LookUp(NamedTuple):
    """Ask which of these journal keys have a row: a call's lookup, within one place of the gate."""

    request: int
    kind: str
    #: ``(job, table, create_table)`` of the call's journal.
    journal: tuple[str, str, bool]
    keys: list[str]


class Exit(NamedTuple):
    """Dispose of the engines and end."""


# Worker to parent.


class Ready(NamedTuple):
    """The worker serves."""

    pid: int


class Begun(NamedTuple):
    """``MARK_BEGUN`` by message, where no marks are shared."""

    call: int
    #: The unit's index in the call's input.
    unit: int


class Committing(NamedTuple):
    """
    ``MARK_COMMITTING`` by message, where no marks are shared.

    With ``verify_commits``, every worker sends it: it holds what the parent needs to ask the server
    if the worker dies.
    """

    call: int
    #: The unit's index in the call's input.
    unit: int
    xid: str | None
    #: The unit's value, pickled.
    value: bytes


class Settled(NamedTuple):
    """A unit's outcome."""

    call: int
    #: The unit's index in the call's input.
    unit: int
    latency_s: float
    wait_s: float
    attempts: int
    commit_unknown: bool
    commit_verified: bool
    failed: bool
    #: The error pickled if it failed, else the value pickled, or None if :class:`Committing` carried it.
    data: bytes | None
    #: The error's traceback, if it failed.
    text: str


class Returned(NamedTuple):
    """Handed units the worker will not start."""

    call: int
    indexes: list[int]


class Closed(NamedTuple):
    """Nothing of the call is left on this worker."""

    call: int
    peak_connections: int
    peak_units: int
    #: With ``batch=``: the call's batches committed on this worker, and units it ran again.
    batches_committed: int = 0
    units_rerun: int = 0


class CallFailed(NamedTuple):
    """The call cannot run on this worker: it has no engine, say."""

    call: int
    error: bytes | None
    text: str


class Verified(NamedTuple):
    """What the server said of a dead worker's COMMIT: "committed", "aborted" or "unknown"."""

    call: int
    #: The unit's index in the call's input.
    unit: int
    status: str


class LookedUp(NamedTuple):
    """The keys of a :class:`LookUp` that have a row; or, if ``text``, the error the lookup raised."""

    request: int
    done: list[str]
    error: bytes | None = None
    text: str = ""


#: What a worker says of one call.
CallMessage = Begun | Committing | Settled | Returned | Closed | CallFailed | Verified


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, its ``__cause__`` in the caller."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n'''\n{self.text}'''"


def dump_value(value: Any, index: int) -> bytes:
    """``value`` pickled, or :class:`UnpicklableError`, raised inside the unit so that it rolls back."""
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        msg = (
            f"unit {index} returned {type(value).__qualname__}, which cannot be pickled to send it back "
            f"from its worker process ({type(error).__qualname__}: {error}): return plain data "
            "(numbers, strings, tuples, dicts), not ORM objects or connections; the unit was rolled back"
        )
        raise UnpicklableError(msg) from None


def dump_error(error: BaseException, index: int) -> tuple[bytes | None, str]:
    """A unit's exception pickled, or ``None`` if it cannot be, and its traceback as text."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        return pickle.dumps(error, pickle.HIGHEST_PROTOCOL), text
    except Exception:
        return None, text


def load_error(data: bytes | None, text: str, index: int) -> Exception:
    """The exception a worker sent, or an UnpicklableError, with its traceback as ``__cause__``."""
    error: Exception | None = None
    why = "it could not be pickled in the worker"
    if data is not None:
        try:
            loaded = pickle.loads(data)
        except Exception as unpickling:
            why = f"it could not be unpickled here ({type(unpickling).__qualname__}: {unpickling})"
        else:
            error = loaded if isinstance(loaded, Exception) else None
    if error is None:
        last = text.rstrip().rsplit("\n", 1)[-1]
        error = UnpicklableError(f"unit {index} failed in its worker process with {last}; {why}")
    error.__cause__ = RemoteTraceback(text)
    return error
