"""What crosses the process boundary of a ProcessRunner: a worker's settings, and the messages both ways."""

from __future__ import annotations

import dataclasses
import enum
import pickle
import traceback
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import URL

from .._batch import BatchPolicy
from .._errors import UnpicklableError
from .._retry import RetryPolicy

__all__ = [
    "Kind",
    "RemoteTraceback",
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
# The parent gives each unit it hands to a worker a *place* (an index into the worker's marks, free
# again once the unit settled or came back) and clears its mark. The worker marks the unit before
# the unit's first statement, and again before its COMMIT. A local worker stores the marks in memory
# it shares with the parent: no message, no system call; the parent reads them only once the
# worker has ended (so they cannot change any more). A worker that may be on another host (Dask)
# has no shared memory: it sends each mark in a message instead (STARTED, COMMITTING), in the
# pipe before the step it announces.
MARK_HANDED = 0  # handed, not begun: if the worker dies, the unit runs on another
MARK_BEGUN = 1  # its first statement may have been sent: if the worker dies, the unit failed
MARK_COMMITTING = 2  # its COMMIT may have been sent: if the worker dies, its outcome is unknown


def most_handed(share: int) -> int:
    """
    Units the parent hands a worker with this share at most, so places of its marks.

    Three times its share: the parent refills a worker once no more than its share is left handed
    to it, so each refill is twice the share (at twice its share, a refill was the share: twice as
    many for the parent to send and the worker to read).
    """
    return 3 * share


# -- messages: tuples whose first item says what they are ------------------------------------------
# Parent to worker.
CALL = 1  # (CALL, call, kind, fn pickled): a call's function, before its first units
UNITS = 2  # (UNITS, call, [(index, item pickled, place), ...]): units to run, in this order
CLOSE = 3  # (CLOSE, call): no more units: finish, then CLOSED
STOP = 4  # (STOP, call): start no more units (RETURNED), finish those in flight, then CLOSED
CANCEL = 5  # (CANCEL, call): as STOP, and cancel the units in flight (rolled back)
VERIFY = 6  # (VERIFY, kind, [(call, index, xid), ...]): ask the server what became of these COMMITs
EXIT = 7  # (EXIT,): dispose of the engines and end
# Worker to parent.
READY = 11  # (READY, pid): the worker serves
STARTED = 12  # (STARTED, call, index): MARK_BEGUN, by message (no shared marks)
#: (COMMITTING, call, index, xid, value pickled): MARK_COMMITTING by message (no shared marks), or,
#: with ``verify_commits``, what the parent needs to ask the server if the worker dies.
COMMITTING = 13
#: (OUTCOME, call, index, latency, wait, attempts, unknown, verified, failed, data, text): ``data``
#: is the error pickled if it failed, else the value pickled (None if COMMITTING carried it).
OUTCOME = 14
RETURNED = 15  # (RETURNED, call, [index, ...]): handed units it will not start
#: (CLOSED, call, peak connections, peak units in flight): nothing of the call is left on this worker.
CLOSED = 16
CALL_FAILED = 17  # (CALL_FAILED, call, error pickled, text): the call cannot run here (no engine)
VERIFIED = 18  # (VERIFIED, call, index, "committed" | "aborted" | "unknown")


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process (its ``__cause__`` in the caller)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n'''\n{self.text}'''"


def dump_value(value: Any, index: int) -> bytes:
    """``value`` pickled, or :class:`UnpicklableError` (raised inside the unit, so it rolls back)."""
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
    """A unit's exception pickled (``None`` if it cannot be), and its traceback as text."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        return pickle.dumps(error, pickle.HIGHEST_PROTOCOL), text
    except Exception:
        return None, text


def load_error(data: bytes | None, text: str, index: int) -> Exception:
    """The exception a worker sent, with its traceback as ``__cause__``; or an UnpicklableError."""
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
