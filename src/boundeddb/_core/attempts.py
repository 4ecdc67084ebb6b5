"""
One unit from its first attempt to its outcome, written once for every executor.

An executor runs one attempt and returns the unit's value or raises. :meth:`Attempts.settle` says
what a failure means: the unit's :class:`~boundeddb.Outcome`, or the delay before its next attempt.
A unit backing off never holds a slot: :meth:`Attempts.rest` gives it back for each back-off.
A journal's lookup is retried by the same rule: :meth:`Attempts.retried` and its twin in a thread.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from time import perf_counter
from typing import Any, Final, Protocol, TypeVar

import anyio

from .._errors import UnitMisuseError
from .._outcome import Outcome
from .._telemetry import active
from .limiter import Slot
from .recorder import NullRecorder
from .withdrawals import Withdrawn

__all__ = [
    "Attempts",
    "CommitUnknown",
    "CommitVerified",
    "ConnectFailed",
    "Retry",
    "RetryRule",
    "UnitMisuse",
]

logger = logging.getLogger("boundeddb.retry")

WorkerT = TypeVar("WorkerT")
T = TypeVar("T")

#: Seconds between two looks at whether its run stopped, for a back-off in a thread.
_STOPPED_POLL_S: Final = 0.02


class ConnectFailed(Exception):
    """Carries the error of opening a unit's connection: the unit never ran, nothing was sent."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class CommitUnknown(Exception):
    """
    Carries a unit's error raised while the runner committed, when the commit may have happened.

    With ``verify_commits``, also what the executor needs to ask the server afterwards: the
    transaction's id, ``None`` if it had none or nobody read it, and the unit's value.
    """

    def __init__(self, error: Exception, xid: str | None = None, value: Any = None) -> None:
        super().__init__(error)
        self.error = error
        self.xid = xid
        self.value = value


class CommitVerified(Exception):
    """
    With ``verify_commits``: a COMMIT whose connection was lost, and what the server said became of it.

    ``committed``: the unit succeeded with ``value``. Otherwise the server aborted the
    transaction: the attempt failed with ``error``, the COMMIT's own, and nothing was committed.
    """

    def __init__(self, error: Exception, *, committed: bool, value: Any = None) -> None:
        super().__init__(error)
        self.error = error
        self.committed = committed
        self.value = value


class UnitMisuse(Exception):
    """Carries the error about how a unit was written, not a database failure of the unit."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.error = UnitMisuseError(message)


class RetryRule(Protocol):
    """What the attempt loop needs of a :class:`~boundeddb.RetryPolicy`."""

    @property
    def attempts(self) -> int: ...

    @property
    def on_retry(self) -> Callable[[Exception, int, float], object] | None: ...

    def should_retry(self, error: Exception, attempt: int) -> bool: ...

    def delay(self, attempt: int) -> float: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    """A unit whose attempt failed and is owed another, after ``delay`` seconds."""

    unit: Any
    index: int
    #: The number of the attempt it is owed: 2 after the first failed.
    attempt: int
    delay: float
    #: Seconds it waited for slots so far.
    wait_s: float


def _own(error: Exception) -> Exception:
    """The error to raise for a failed attempt: the one a :class:`ConnectFailed` carries, else itself."""
    return error.error if isinstance(error, ConnectFailed) else error


def _fields(index: int, attempt: int, error: str) -> dict[str, object]:
    """A retry log record's ``extra``: what structured handlers index by."""
    return {"unit": index, "attempt": attempt, "error": error}


#: One attempt of ``unit``, number ``index``, by ``worker``: its value, or it raises.
AttemptFn = Callable[[WorkerT, Any, int], Awaitable[Any]]


class Attempts:
    """The retry rule of a runner, applied to each failed attempt."""

    __slots__ = ("_failed", "_labels", "_retry")

    def __init__(
        self,
        retry: RetryRule,
        *,
        failed: Callable[[Exception, float], None] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self._retry = retry
        #: With an auto limit: told each failed attempt's own error and how long it ran, so that the
        #: controller can look for overload.
        self._failed = failed
        #: The runner's attributes for the retries counter of ``boundeddb.instrument()``.
        self._labels = labels or {}

    def settle(
        self, error: Exception, index: int, attempt: int, latency_s: float, wait_s: float
    ) -> Outcome[Any] | float:
        """The outcome of a failed attempt, or the seconds to wait before the next one."""
        verified = False
        if isinstance(error, CommitVerified):
            if error.committed:  # the server committed it: the unit succeeded
                return Outcome(index, error.value, None, latency_s, wait_s, attempt, commit_verified=True)
            verified = True  # the server aborted it: a failed attempt like any other, and safe to retry
            error = error.error
        elif isinstance(error, Withdrawn):  # its caller gave up (a batch's submit()): never run again
            return Outcome(index, None, error, latency_s, wait_s, attempt)
        if self._failed is not None:
            own = error.error if isinstance(error, (ConnectFailed, CommitUnknown)) else error
            self._failed(own, latency_s)
        if isinstance(error, UnitMisuse):
            return Outcome(index, None, error.error, latency_s, wait_s, attempt)
        if isinstance(error, CommitUnknown):
            logger.warning(
                "unit %d: the connection failed during COMMIT (%s); it may have committed",
                index,
                type(error.error).__qualname__,
            )
            return Outcome(index, None, error.error, latency_s, wait_s, attempt, True)
        shown = error
        if isinstance(error, ConnectFailed):
            # The unit never ran: retrying is safe whatever the error, if the policy allows more.
            shown = error.error
            retry = attempt < self._retry.attempts
        else:
            retry = self._retry.should_retry(error, attempt)
        name = type(shown).__qualname__
        if not retry:
            level = logging.WARNING if attempt > 1 else logging.DEBUG  # a unit whose retries ran out: once
            fields = _fields(index, attempt, name)
            logger.log(level, "unit %d failed after %d attempt(s): %s", index, attempt, name, extra=fields)
            return Outcome(index, None, shown, latency_s, wait_s, attempt, commit_verified=verified)
        delay = self._retry.delay(attempt)
        logger.debug(
            "unit %d attempt %d failed with %s; retrying in %.3f s",
            index,
            attempt,
            name,
            delay,
            extra={**_fields(index, attempt, name), "delay": delay},
        )
        self._tell_retry(shown, attempt, delay)
        return delay

    def again(self, error: Exception, attempt: int, latency_s: float, what: str = "a batch") -> float | None:
        """
        Seconds before a batch whose attempt number ``attempt`` failed with ``error`` runs again as a
        whole, or ``None`` if it is not to: the policy does not retry the error, or it ran out.
        ``what`` names what failed in the log: a batch, or a journal's lookup.
        """
        if self._failed is not None:
            self._failed(error.error if isinstance(error, ConnectFailed) else error, latency_s)
        if isinstance(error, UnitMisuse):
            return None
        if isinstance(error, ConnectFailed):
            shown: Exception = error.error
            retry = attempt < self._retry.attempts
        else:
            shown = error
            retry = self._retry.should_retry(error, attempt)
        if not retry:
            return None
        delay = self._retry.delay(attempt)
        name = type(shown).__qualname__
        logger.debug("%s's attempt %d failed with %s; retrying it in %.3f s", what, attempt, name, delay)
        self._tell_retry(shown, attempt, delay)
        return delay

    async def retried(self, attempt_fn: Callable[[], Awaitable[T]], what: str, slot: Slot | None = None) -> T:
        """
        What ``attempt_fn()`` returns, tried as often as the policy retries a unit: what it raised
        last, unchanged, once the policy does not retry it or ran out (a :class:`ConnectFailed`, the
        error it carries). Each back-off sleeps on the loop, ``slot`` (if given) given back meanwhile.
        """
        attempt = 1
        while True:
            started = perf_counter()
            try:
                return await attempt_fn()
            except Exception as error:
                failed = error
            delay = self.again(failed, attempt, perf_counter() - started, what)
            if delay is None:
                raise _own(failed)
            if slot is not None:
                slot.give()  # never hold a connection slot while backing off
            await anyio.sleep(delay)
            if slot is not None:
                await slot.take()
            attempt += 1

    def retried_sync(self, attempt_fn: Callable[[], T], what: str, stopped: Callable[[], bool]) -> T:
        """
        As :meth:`retried`, in a worker thread, which sleeps each back-off. Once ``stopped()`` (the
        run stopped starting units, or was cancelled), it backs off no more and raises the last error.
        """
        attempt = 1
        while True:
            started = perf_counter()
            try:
                return attempt_fn()
            except Exception as error:
                failed = error
            delay = self.again(failed, attempt, perf_counter() - started, what)
            if delay is None:
                raise _own(failed)
            until = perf_counter() + delay
            while (left := until - perf_counter()) > 0 and not stopped():
                time.sleep(min(left, _STOPPED_POLL_S))
            if stopped():
                raise _own(failed)
            attempt += 1

    @staticmethod
    def commit_unknown(unknown: CommitUnknown, first: int, units: int) -> None:
        """Log, once for the batch, a COMMIT of ``units`` units from ``first`` whose fate is unknown."""
        logger.warning(
            "batch of %d units from unit %d: the connection failed during COMMIT (%s); it may have committed",
            units,
            first,
            type(unknown.error).__qualname__,
        )

    def _tell_retry(self, error: Exception, attempt: int, delay: float) -> None:
        """The policy's ``on_retry`` and the retries counter, told of a retry, off the per-unit path."""
        hook = self._retry.on_retry
        if hook is not None:
            try:
                hook(error, attempt, delay)
            except Exception as raised:
                logger.warning("on_retry raised %s: ignored", type(raised).__qualname__, exc_info=True)
        telemetry = active()
        if telemetry is not None:
            telemetry.retried(self._labels)

    async def rest(
        self,
        attempt_fn: AttemptFn[WorkerT],
        worker: WorkerT,
        slot: Slot,
        recorder: NullRecorder,
        retry: Retry,
    ) -> Outcome[Any]:
        """
        The attempts a unit is owed after its first failed: each after a back-off without a slot.

        ``slot`` is the worker's: given back if held for each back-off, and taken again after it.
        A unit that comes here without a slot, handed to a worker of its own, was counted as
        paused when it gave its first one up.
        """
        unit, index, attempt = retry.unit, retry.index, retry.attempt
        delay, wait_s = retry.delay, retry.wait_s
        while True:
            if slot.held:
                slot.give()  # never hold a connection slot while backing off
                recorder.attempt_paused()
            await anyio.sleep(delay)
            waited = perf_counter()
            await slot.take()
            recorder.attempt_resumed()
            wait_s += perf_counter() - waited
            started = perf_counter()
            try:
                value = await attempt_fn(worker, unit, index)
            except Exception as error:
                settled = self.settle(error, index, attempt, perf_counter() - started, wait_s)
                if isinstance(settled, Outcome):
                    return settled
                delay = settled
                attempt += 1
            else:
                return Outcome(index, value, None, perf_counter() - started, wait_s, attempt)
