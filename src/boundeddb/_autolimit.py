"""AutoLimit: the settings of a runner whose limit finds itself (``limit="auto"``)."""

from __future__ import annotations

import dataclasses

__all__ = ["AutoLimit", "check_positive_int"]


def check_positive_int(name: str, value: object, *, hint: str) -> int:
    """Return ``value`` if it is an int >= 1, else raise an error that names it and the fix."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{name} must be an int >= 1, got {value!r} ({type(value).__name__}): {hint}"
        raise TypeError(msg)
    if value < 1:
        msg = f"{name} must be >= 1, got {value!r}: {hint}"
        raise ValueError(msg)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class AutoLimit:
    """
    A concurrency limit that the runner moves by itself while it works; ``limit="auto"`` is
    ``AutoLimit()``.

    The runner looks for the fewest units in flight that give (about) the most throughput. From each
    unit's latency (from opening its session to closing it) and the units in flight, it measures
    throughput by Little's law, in windows of at least ``max(32, 2 * limit)`` units (16 while it
    climbs) and a tenth of a second. It starts by doubling the limit while doubling pays (a third
    more throughput; four times after a doubling that doubled it), or halving it while halving costs
    at most 2% if the first doubling did not pay, and takes the best limit it measured. Then it
    holds that limit and, now and then, spends a window a quarter above or below it (later at first
    on a side where what the climb measured shows it would not pay): it moves up once the higher
    limit is shown to give more than 1.02 times the throughput, and down once the lower one is shown
    to give more than 0.98 times it (fewer connections for the same work are better); a higher limit
    that pays like a doubling sets it climbing again from there. When throughput at the limit jumps
    or falls by more than 1.6 times (another workload came to or left the server), it starts again.
    A unit timeout, a pool timeout, a deadlock or a serialization failure cuts the limit by a quarter
    at once.
    See :doc:`/how-to/auto-limit`.

    The limit stays within ``[min_limit, max_limit]``, and never above the pool's capacity; units in
    flight never exceed the current limit, also while it moves.

    Args:
        min_limit: The lowest the limit goes (>= 1).
        max_limit: The highest it goes. Defaults to the pool's capacity (``pool_size +
            max_overflow``); above it is a :class:`ValueError`. Required for pools without a fixed
            capacity, such as :class:`~sqlalchemy.pool.NullPool`.
        initial: Where it starts. Defaults to 4 (within ``[min_limit, max_limit]``).

    .. versionadded:: 0.2.0
    """

    min_limit: int = 1
    max_limit: int | None = None
    initial: int | None = None

    def __post_init__(self) -> None:
        for name in ("min_limit", "max_limit", "initial"):
            value = getattr(self, name)
            if value is not None or name == "min_limit":
                check_positive_int(f"AutoLimit({name}=...)", value, hint="a number of units in flight")
        if self.max_limit is not None and self.max_limit < self.min_limit:
            msg = (
                f"AutoLimit(max_limit={self.max_limit}) is below min_limit={self.min_limit}: "
                "pass max_limit >= min_limit"
            )
            raise ValueError(msg)
        if self.initial is not None and not (
            self.min_limit <= self.initial <= (self.max_limit or self.initial)
        ):
            msg = (
                f"AutoLimit(initial={self.initial}) is outside [min_limit={self.min_limit}, "
                f"max_limit={self.max_limit}]: pass an initial limit between the two"
            )
            raise ValueError(msg)
