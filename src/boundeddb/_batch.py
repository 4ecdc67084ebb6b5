"""BatchPolicy: how many units a runner puts in one transaction, and how long it waits to fill one."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["BatchPolicy", "check_batch"]


@dataclasses.dataclass(frozen=True, slots=True)
class BatchPolicy:
    """
    Up to ``size`` units run one after another in one session and one transaction, committed once.

    A unit is ``ok`` only once its batch's COMMIT succeeded, and a failing unit never takes the
    others' writes with it: the batch is rolled back, the other units run again without it, and the
    failing unit runs alone, as it would without batches.
    A failure that names no unit, a duplicate key found when the batch's rows are flushed, say, is
    looked for in one more pass that flushes each unit's changes as it returns. What that cannot
    name, a deferred constraint, is bisected until the culprit stands alone.
    So a unit may be *executed* more than once, but it commits at most once.
    :doc:`/how-to/batches` says when batches pay and how to choose ``size`` and ``linger``.

    Args:
        size: The most units in one transaction. ``1`` is one transaction per unit.
        linger: Seconds a batch that is not full waits for more units before it starts.
            It matters for many concurrent :meth:`~boundeddb.SemaphoreRunner.submit` calls and for
            slow async iterators. A full batch starts at once, and ``0`` never waits.
            A ``submit()`` with ``priority > 0`` is never held by it.

    Concurrent :meth:`~boundeddb.SemaphoreRunner.submit` calls share batches: each returns its own
    unit's value, or raises its own exception, once its batch committed. What counts for a
    ``submit()`` that is cancelled is its batch's COMMIT being sent. Cancelled before, it withdraws
    its unit, which never commits, even if the unit had returned: the batch, if it began, stops
    before its next unit or its COMMIT and runs the other units again without it. Cancelled once
    the COMMIT had begun, it cannot take its unit back: it waits for the batch's outcome, calls its
    ``on_outcome`` with its unit's (ok, failed, or ``commit_unknown``), then raises the cancellation.
    So a cancelled ``submit()`` whose ``on_outcome`` was not called did not commit and never will.

    .. versionadded:: 0.3.0
    """

    size: int
    linger: float = 0.0

    def __post_init__(self) -> None:
        size: object = self.size
        if isinstance(size, bool) or not isinstance(size, int):
            msg = (
                f"BatchPolicy(size=...) must be an int >= 1, got {size!r} ({type(size).__name__}): "
                "pass e.g. size=50"
            )
            raise TypeError(msg)
        if size < 1:
            msg = f"BatchPolicy(size=...) must be >= 1 (1 is one transaction per unit), got {size!r}"
            raise ValueError(msg)
        linger: object = self.linger
        if isinstance(linger, bool) or not isinstance(linger, (int, float)):
            msg = (
                f"BatchPolicy(linger=...) must be a number of seconds >= 0, got {linger!r} "
                f"({type(linger).__name__}): pass e.g. linger=0.005"
            )
            raise TypeError(msg)
        if not (math.isfinite(linger) and linger >= 0):
            msg = f"BatchPolicy(linger=...) must be a finite number of seconds >= 0, got {linger!r}"
            raise ValueError(msg)


def check_batch(batch: object) -> BatchPolicy | None:
    """``batch`` as a policy, or ``None`` for one transaction per unit, or else an error naming the fix."""
    if batch is None:
        return None
    if isinstance(batch, BatchPolicy):
        policy = batch
    elif isinstance(batch, int) and not isinstance(batch, bool):
        if batch < 1:
            msg = (
                f"batch must be an int >= 1 or a boundeddb.BatchPolicy, got {batch!r}: "
                "pass e.g. batch=50 for up to 50 units per transaction, or batch=None for one each"
            )
            raise ValueError(msg)
        policy = BatchPolicy(size=batch)
    else:
        msg = (
            f"batch must be None, an int >= 1 or a boundeddb.BatchPolicy, got {batch!r} "
            f"({type(batch).__name__}): pass e.g. batch=50 or batch=BatchPolicy(size=500, linger=0.005)"
        )
        raise TypeError(msg)
    return policy if policy.size > 1 else None
