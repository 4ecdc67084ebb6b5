"""
A run of a journal's units: the input also holds items whose outcome is known without running them.

``_runners/journal_units.py`` makes such an input, and ``docs/explanation/architecture.md`` tells
how the journal works.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from typing import Any, Final

import anyio

from .._outcome import Outcome
from .ahead import END_OF_INPUT
from .run import END, REFUSED, Pulled, Run, SinkT

__all__ = ["SKIPPED", "Foregone", "JournalledRun", "foregone_outcome"]


class Foregone:
    """
    An item of a journalled input whose outcome is known without running it: done already, or failed.

    :class:`JournalledRun` numbers it as it would a unit, and gives it its outcome on the spot.
    """

    __slots__ = ("error",)

    def __init__(self, error: Exception | None) -> None:
        #: Why the item failed before a unit was made for it, or None if it is done already.
        self.error = error


#: An item whose journal row says it is done: its outcome is :attr:`Outcome.skipped`.
SKIPPED: Final = Foregone(None)


def foregone_outcome(foregone: Foregone, index: int) -> Outcome[Any]:
    """The outcome of a :class:`Foregone` item numbered ``index``."""
    if foregone.error is None:
        return Outcome(index, None, None, 0.0, 0.0, attempts=0, skipped=True)
    return Outcome(index, None, foregone.error, 0.0, 0.0, attempts=0)


class JournalledRun(Run[SinkT]):
    """A :class:`Run` whose input may hold :class:`Foregone` items: each settles where it is pulled."""

    def __init__(self, units: Iterable[Any] | AsyncIterable[Any], sink: SinkT, **options: Any) -> None:
        super().__init__(units, sink, **options)
        self._admit_unit = self._admit  # the run's own, wrapped in telemetry or not
        self._admit = self._admit_journalled  # type: ignore[method-assign]
        #: Over a plain iterable: async only for the key lookups, which take milliseconds.
        self.prompt = bool(getattr(units, "prompt", False))

    async def pull(self) -> tuple[Any, int] | Pulled:
        """
        As :meth:`Run.pull`. The items done already settle under the lock, without a trip through
        the event loop each, which is what makes a resume fast.
        """
        if self._async_pull_lock is None:
            self._async_pull_lock = anyio.Lock()
        async with self._async_pull_lock:
            while True:
                if self.stopping:
                    return END
                unit = await self.take()
                if unit is END_OF_INPUT:
                    return END
                index = self._next_index
                self._next_index = index + 1
                if unit.__class__ is not Foregone:
                    break
                self._admit_journalled(unit, index)
        return self._admit_unit(unit, index)

    def _admit_journalled(self, unit: Any, index: int) -> tuple[Any, int] | Pulled:
        """As :meth:`Run._admit`. A :class:`Foregone` item settles on the spot."""
        if unit.__class__ is not Foregone:
            return self._admit_unit(unit, index)
        if unit.error is None:
            self.recorder.unit_skipped()
            self._put(foregone_outcome(unit, index))
        else:
            self.recorder.unit_started()
            self.finish(foregone_outcome(unit, index))
        return REFUSED
