"""AutoLimit: the settings of a runner whose limit finds itself, ``limit="auto"``."""

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
    A concurrency limit that the runner moves by itself while it works.

    ``limit="auto"`` is ``AutoLimit()``.
    The runner looks for the fewest units in flight that give about the most throughput, measured
    by Little's law from the units' latencies. It climbs first, doubling the limit while doubling
    pays, then holds the best limit it found and looks a quarter above and below it now and then.
    A sign of overload, such as a timeout or a deadlock, cuts the limit by a quarter at once.
    :doc:`/how-to/auto-limit` says what it does on real workloads and how to tune it, and
    :doc:`/explanation/auto-limit-controller` says how it decides.

    The limit stays within ``[min_limit, max_limit]``, and never above the pool's capacity. Units in
    flight never exceed the current limit, also while it moves.

    Args:
        min_limit: The lowest the limit goes, at least 1.
        max_limit: The highest it goes. Defaults to the pool's capacity, ``pool_size +
            max_overflow``, and above it is a :class:`ValueError`. Required for pools without a fixed
            capacity, such as :class:`~sqlalchemy.pool.NullPool`.
        initial: Where it starts. Defaults to 4, within ``[min_limit, max_limit]``.

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
