"""How a runner retries a failed unit: which errors are worth a fresh transaction, and when."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

from ._dialects import all_dialects

__all__ = ["RetryPolicy", "is_transient"]


def is_transient(error: BaseException) -> bool:
    """
    Return whether ``error`` is a transient database error, worth retrying in a fresh transaction.

    These are PostgreSQL serialization failures and deadlocks, SQLSTATEs ``40001`` and ``40P01``,
    MySQL and MariaDB deadlocks and lock wait timeouts, errors 1213 and 1205,
    and a connection that was lost, refused or invalidated.
    A lost connection shows as :attr:`sqlalchemy.exc.DBAPIError.connection_invalidated`, as SQLSTATE
    class ``08``, as ``57P01``-``57P03`` from a terminated backend or a restarting server, or as an
    :class:`OSError`.
    Nothing else: not constraint violations, not timeouts, not programming errors.

    A connection lost while the runner was committing is never retried, whatever the policy says:
    the commit may have happened. See :attr:`boundeddb.Outcome.commit_unknown`.

    .. versionadded:: 0.1.0
    """
    return any(dialect.is_transient(error) for dialect in all_dialects())


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """
    When and how often a failed unit is run again, each time in a fresh session and transaction.

    A retry releases the unit's slot while it waits, so a backing-off unit never holds a connection.
    When the attempts run out, the last attempt's exception goes through unchanged.
    A :class:`~boundeddb.Journal`'s lookups are retried by the same policy, each attempt on a new
    connection (see :doc:`/explanation/guarantees`).
    Delays grow exponentially from ``initial_delay`` by ``multiplier``, capped at ``max_delay``.
    With ``jitter`` each delay is drawn uniformly from its upper half, so that units that failed
    together do not retry together.

    Args:
        attempts: Tries in all, the first included: ``1`` means no retry.
        initial_delay: Seconds before the second attempt.
        max_delay: The cap on any one delay, in seconds.
        multiplier: How much each delay grows over the previous one.
        jitter: Randomise each delay within its upper half.
        retry_on: Which exceptions to retry. Defaults to :func:`is_transient`.
            Pass your own predicate to widen or narrow it.
        on_retry: Called as ``on_retry(error, attempt, delay)`` before each back-off, with the failed
            attempt's exception, its number counted from 1, and the seconds to wait: count or
            log retries your own way; a journal's lookups call it too. It runs where the unit ran,
            in a worker thread for :class:`~boundeddb.ThreadOffloadRunner`. What it raises is
            logged and ignored.
            See :doc:`/how-to/observe`. *New in 0.2.0.*

    .. versionadded:: 0.1.0
    """

    attempts: int = 3
    initial_delay: float = 0.05
    max_delay: float = 2.0
    multiplier: float = 2.0
    jitter: bool = True
    retry_on: Callable[[Exception], bool] = is_transient
    on_retry: Callable[[Exception, int, float], object] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            msg = f"attempts must be an int, got {self.attempts!r}: pass e.g. attempts=3"
            raise TypeError(msg)
        if self.attempts < 1:
            msg = f"attempts must be >= 1 (1 means no retry), got {self.attempts!r}"
            raise ValueError(msg)
        for name in ("initial_delay", "max_delay"):
            _check_number(name, getattr(self, name), minimum=0.0, unit="a number of seconds")
        _check_number("multiplier", self.multiplier, minimum=1.0, unit="a number")
        retry_on: object = self.retry_on
        if not callable(retry_on):
            msg = (
                f"retry_on must be a callable taking the exception and returning a bool, "
                f"got {self.retry_on!r}"
            )
            raise TypeError(msg)
        on_retry: object = self.on_retry
        if on_retry is not None and not callable(on_retry):
            msg = (
                f"on_retry must be None or a callable taking (error, attempt, delay), got {self.on_retry!r}: "
                "pass e.g. on_retry=lambda error, attempt, delay: retries.inc()"
            )
            raise TypeError(msg)

    def should_retry(self, error: Exception, attempt: int) -> bool:
        """Whether a unit whose attempt number ``attempt``, counted from 1, raised ``error`` runs again."""
        return attempt < self.attempts and bool(self.retry_on(error))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt``, counted from 1."""
        ceiling = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        if self.jitter:
            return random.uniform(ceiling / 2, ceiling)
        return ceiling


def _check_number(name: str, value: object, *, minimum: float, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"{name} must be {unit} >= {minimum:g}, got {value!r} ({type(value).__name__})"
        raise TypeError(msg)
    if not math.isfinite(value) or value < minimum:
        msg = f"{name} must be {unit} >= {minimum:g} and finite, got {value!r}"
        raise ValueError(msg)


#: The policy that never retries: the default of every runner.
NO_RETRY = RetryPolicy(attempts=1)
