"""The input indexes a load's journal says committed: runs of indexes, kept as journal keys."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Final

__all__ = ["KEY_PREFIX", "IndexRanges"]

#: What a load's journal keys start with: ``rows:START-STOP``, the input indexes START to STOP - 1.
KEY_PREFIX: Final = "rows:"


class IndexRanges:
    """Sorted, disjoint runs of input indexes, asked about in increasing order of index."""

    __slots__ = ("_next", "_starts", "_stops", "count")

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        ordered = sorted(runs)
        self._starts = [start for start, _ in ordered]
        self._stops = [stop for _, stop in ordered]
        #: The run :meth:`holds` looks at first: indexes are asked about in increasing order.
        self._next = 0
        #: How many indexes the runs hold.
        self.count = sum(stop - start for start, stop in ordered)

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> IndexRanges:
        """The runs that a load's journal keys name; keys of another shape are not a load's."""
        runs = []
        for key in keys:
            if key.startswith(KEY_PREFIX):
                start, _, stop = key[len(KEY_PREFIX) :].partition("-")
                if start.isdigit() and stop.isdigit():
                    runs.append((int(start), int(stop)))
        return cls(runs)

    @staticmethod
    def key(start: int, stop: int) -> str:
        """The journal key of the input indexes ``start`` to ``stop - 1``."""
        return f"{KEY_PREFIX}{start}-{stop}"

    @classmethod
    def keys_of(cls, indexes: Iterable[int]) -> list[str]:
        """The journal keys of ``indexes``, given in increasing order: one per run of consecutive ones."""
        keys: list[str] = []
        start = stop = -1
        for index in indexes:
            if index != stop:
                if stop > start:
                    keys.append(cls.key(start, stop))
                start = index
            stop = index + 1
        if stop > start:
            keys.append(cls.key(start, stop))
        return keys

    def holds(self, index: int) -> bool:
        """Whether a run holds ``index``; each call's ``index`` is larger than the last one's."""
        stops, position = self._stops, self._next
        if position >= len(stops):
            return False
        if index >= stops[position]:
            position = self._next = bisect.bisect_right(stops, index)
            if position >= len(stops):
                return False
        return self._starts[position] <= index
