"""
What a batch of ``submit()`` calls shares with their callers: the units whose callers gave up, and
the units whose COMMIT began.

A ``submit()`` that is cancelled withdraws its unit, unless the COMMIT of a transaction holding it
has begun: from then on the unit cannot be taken back, and its caller waits to hear what the server
did (``gather.py``). The batch's run checks that no unit of an attempt is withdrawn and marks the
attempt's COMMIT begun in one step, under a lock that the callers take too: a thread runner's
attempt checks in a worker thread while a caller gives up on the event loop. So each unit is either
withdrawn before its COMMIT began, and never commits, or committing, and its caller hears the
outcome, never both and never neither.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Final

__all__ = ["NO_WITHDRAWALS", "Withdrawals", "Withdrawn"]


class Withdrawn(Exception):
    """A unit whose ``submit()`` was cancelled before its batch's COMMIT began: it never commits."""

    def __init__(self, index: int) -> None:
        super().__init__(
            f"unit {index}'s submit() was cancelled before its batch's COMMIT began: rolled back"
        )


class Withdrawals:
    """A batch's withdrawn units, and the attempt whose COMMIT began: see the module docstring."""

    __slots__ = ("_committing", "_lock", "indexes")

    def __init__(self) -> None:
        #: The indexes of the units whose callers gave up: an attempt that holds one stops before its
        #: next unit or its COMMIT. A set that is only ever added to, so a script may keep a reference.
        self.indexes: set[int] = set()
        #: The units of the last attempt whose COMMIT began: none of them can be withdrawn any more.
        self._committing: Sequence[tuple[Any, int]] = ()
        self._lock = threading.Lock()

    def withdraw(self, index: int) -> bool:
        """
        Unit ``index``'s caller gave up: True if the unit is withdrawn, False if the COMMIT of an
        attempt holding it had begun. Either way, no attempt that begins from now on runs it.
        """
        with self._lock:
            self.indexes.add(index)
            return all(i != index for _, i in self._committing)

    def commit_begins(self, units: Sequence[tuple[Any, int]]) -> int | None:
        """
        Just before the COMMIT of ``units``: the position of the first withdrawn one, which stops the
        attempt; else None, and from now on none of them can be withdrawn. From any thread.
        """
        with self._lock:
            indexes = self.indexes
            if indexes:
                for position, (_, index) in enumerate(units):
                    if index in indexes:
                        return position
            self._committing = units
            return None


class _NoWithdrawals(Withdrawals):
    """Every run's but a batch of ``submit()`` calls': nobody can withdraw a unit, so nothing is locked."""

    __slots__ = ()

    def withdraw(self, index: int) -> bool:  # pragma: no cover - only gather.py withdraws, from its own
        raise AssertionError("a unit of a run that is not a batch of submit() calls was withdrawn")

    def commit_begins(self, units: Sequence[tuple[Any, int]]) -> int | None:
        return None


#: Shared by every run that is not a batch of ``submit()`` calls; never written.
NO_WITHDRAWALS: Final[Withdrawals] = _NoWithdrawals()
