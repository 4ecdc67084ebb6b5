"""
A ``load()``'s chunks: rows pulled lazily into chunks of up to ``batch``, each written in a
transaction of its own by a unit that finds and rejects the rows the database refuses.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from itertools import filterfalse, islice
from operator import itemgetter
from typing import Any

from .._core.rejects import Attempt, RowSearch
from .._dialects.bulk import BulkWriter, FlatRows
from .._outcome import ChunkResult, RejectedRow
from .ranges import IndexRanges
from .target import LoadTarget, Shape

__all__ = ["Chunk", "ChunkMaker"]


class Chunk:
    """Up to ``batch`` rows: their input indexes, the rows as given, and what the bulk statement sends."""

    __slots__ = ("_data", "flat", "indexes", "refused", "rows", "runs")

    def __init__(self, rows: list[Any], indexes: Sequence[int]) -> None:
        self.rows = rows
        #: Each row's input index.
        self.indexes = indexes
        self._data: list[Any] | None = []
        #: The records as one list of values, if the chunk was made so for its writer; else None.
        self.flat: FlatRows | None = None
        #: Where each run of rows of one shape starts: ``(shape, offset)``, in order.
        self.runs: list[tuple[Shape, int]] = []
        #: The rows rejected before they were sent (:meth:`reject`), no longer among :attr:`rows`.
        self.refused: list[RejectedRow] = []

    @property
    def data(self) -> list[Any]:
        """Each row's record (or ``insert()`` parameters), in the order of the chunk."""
        if self._data is None:  # made flat: its records, a tuple each, once something asks for them
            assert self.flat is not None
            self._data = self.flat.records()
        return self._data

    @data.setter
    def data(self, data: list[Any]) -> None:
        self._data = data

    def hold_flat(self, flat: FlatRows) -> None:
        """Hold the records as ``flat``: :attr:`data` makes a tuple of each only if asked for them."""
        self.flat, self._data = flat, None

    def statements(self, attempt: Attempt) -> Iterator[tuple[Shape, Attempt, Sequence[Any]]]:
        """
        One statement's shape, rows and records for each run of one shape among ``attempt``'s rows:
        one statement for the attempt, unless its rows change shape.
        """
        runs = self.runs
        if len(runs) == 1:  # the common chunk: one shape
            yield runs[0][0], attempt, self._records(attempt.spans)
            return
        bounds = [start for _, start in runs[1:]] + [len(self.rows)]
        pieces: list[tuple[Shape, int, int]] = []
        for start, stop in attempt.spans:
            for (shape, run_start), run_stop in zip(runs, bounds, strict=True):
                if run_stop > start and run_start < stop:
                    pieces.append((shape, max(start, run_start), min(stop, run_stop)))
        while pieces:
            shape = pieces[0][0]
            spans = []
            while pieces and pieces[0][0] is shape:
                spans.append(pieces.pop(0)[1:])
            statement = Attempt(tuple(spans), exact=attempt.exact)
            yield shape, statement, self._records(statement.spans)

    def _records(self, spans: tuple[tuple[int, int], ...]) -> Sequence[Any]:
        if self.flat is not None:
            return self.flat.spans(spans)
        data = self.data
        if len(spans) == 1:
            start, stop = spans[0]
            return data if start == 0 and stop == len(data) else data[start:stop]
        return [record for start, stop in spans for record in data[start:stop]]

    def set_aside(self, offsets: list[int]) -> None:
        """Move the rows at ``offsets``, given in increasing order, after the others, in their order."""
        order = list(filterfalse(set(offsets).__contains__, range(len(self.rows)))) + offsets
        self.rows = list(map(self.rows.__getitem__, order))
        self.indexes = list(map(self.indexes.__getitem__, order))
        self.data = list(map(self.data.__getitem__, order))
        self.flat = None  # its records were reordered: the writer takes them

    def reject(self, refused: Mapping[int, Exception]) -> None:
        """
        Reject the rows at the offsets of ``refused`` before they are sent, each for its error, keeping
        the others in their order.
        """
        rows, indexes = self.rows, self.indexes
        self.refused += [RejectedRow(indexes[at], rows[at], error) for at, error in sorted(refused.items())]
        kept = list(filterfalse(refused.__contains__, range(len(self.rows))))
        self.rows = list(map(self.rows.__getitem__, kept))
        self.indexes = list(map(self.indexes.__getitem__, kept))
        self.data = list(map(self.data.__getitem__, kept))
        self.flat = None  # its records were taken apart: the writer takes them
        self.runs = [(self.runs[0][0], 0)] if self.rows else []

    def result(self, search: RowSearch, journal: Any) -> tuple[ChunkResult, list[str]]:
        """The chunk's result once ``search`` ended, and the journal keys of the index runs it committed."""
        rejected = [
            RejectedRow(self.indexes[offset], self.rows[offset], error) for offset, error in search.rejected
        ]
        loaded = len(self.rows) - len(rejected)
        rejected += self.refused
        rejected.sort(key=lambda row: row.index)
        keys: list[str] = []
        if journal is not None:
            indexes = self.indexes
            if not rejected and isinstance(indexes, range):  # one run: its key at once
                keys = [IndexRanges.key(indexes.start, indexes.stop)]
            else:
                refused = {offset for offset, _ in search.rejected}
                keys = IndexRanges.keys_of(
                    sorted(index for offset, index in enumerate(indexes) if offset not in refused)
                )
        return ChunkResult(loaded, rejected, search.sent), keys


class ChunkMaker:
    """Turns rows into :class:`Chunk` units, skipping those a journal says committed."""

    def __init__(
        self,
        target: LoadTarget,
        columns: tuple[str, ...] | None,
        batch: int,
        writer: BulkWriter,
        dialect: Any,
        done: IndexRanges,
        make_unit: Callable[[Chunk], Any],
    ) -> None:
        self._target = target
        self._columns = columns
        self._batch = batch
        self._writer = writer
        self._dialect = dialect
        self._done = done
        #: What makes a chunk's unit.
        self._make_unit = make_unit
        self._shapes: dict[tuple[str, ...], Shape] = {}
        self._getters: dict[Shape, Callable[[Any], tuple[Any, ...]]] = {}
        self._by_key: dict[Shape, list[Callable[[Any], Any]]] = {}
        #: Whether chunks of mappings are made as :class:`FlatRows`, for the writer.
        self._flat = writer.takes_flat
        #: Rows skipped because the journal says they committed.
        self.skipped = 0
        #: Rows the journal says committed, whether or not the input still holds them.
        self.done_count = done.count

    def _shape(self, keys: tuple[str, ...], index: int) -> Shape:
        """The shape of rows with ``keys``, made and checked at its first row, ``index``."""
        shape = self._shapes.get(keys)
        if shape is None:
            self._target.check_keys(keys, f"row {index}")
            shape = self._shapes[keys] = Shape(
                keys, self._target, self._dialect, process=self._writer.takes_records
            )
        return shape

    def _chunk(self, rows: list[Any], indexes: Sequence[int]) -> Chunk:
        """The chunk of ``rows``, of input indexes ``indexes``: each row's keys checked, its record made."""
        chunk = Chunk(rows, indexes)
        first = rows[0]
        if first.__class__ is dict:  # the common chunk: mappings with the first one's keys, at C speed
            keys = tuple(first)
            shape = self._shapes.get(keys) or self._shape(keys, indexes[0])
            flat = self._flat and shape.by_column and bool(shape.names)
            values: list[Any] | None
            try:
                if sum(map(len, rows)) != len(keys) * len(rows):  # and each has every key: the getters say
                    values = None
                elif flat:  # a list of each key's values
                    values = [list(map(get, rows)) for get in self._column_getters(shape)]
                else:
                    values = list(map(self._getter(shape), rows))
            except (KeyError, TypeError):  # a row of other keys, or not a mapping
                values = None
            if values is not None:
                chunk.runs.append((shape, 0))
                if flat:
                    chunk.hold_flat(FlatRows(shape.flat_values(values, len(rows)), len(shape.names)))
                else:
                    chunk.data = values if shape.convert is tuple else shape.convert_all(values)
                return chunk
        data, runs, last = chunk.data, chunk.runs, None
        for offset, row in enumerate(rows):
            keys_of_row, values_of_row = self._target.keys_of(row, self._columns, indexes[offset])
            shape = self._shapes.get(keys_of_row) or self._shape(keys_of_row, indexes[offset])
            if shape is not last:
                runs.append((shape, offset))
                last = shape
            data.append(shape.convert(values_of_row))
        return chunk

    def _column_getters(self, shape: Shape) -> list[Callable[[Any], Any]]:
        """What takes each of ``shape``'s keys from a mapping, in key order."""
        getters = self._by_key.get(shape)
        if getters is None:
            getters = self._by_key[shape] = [itemgetter(key) for key in shape.keys]
        return getters

    def _getter(self, shape: Shape) -> Callable[[Any], tuple[Any, ...]]:
        """What takes a mapping's values in ``shape``'s key order, as a tuple."""
        getter = self._getters.get(shape)
        if getter is None:
            keys = shape.keys
            getter = self._getters[shape] = itemgetter(*keys) if len(keys) > 1 else _single(keys[0])
        return getter

    def _taken(self, index: int, row: Any, rows: list[Any], indexes: list[int]) -> None:
        """Take the row of input index ``index`` into the next chunk, unless the journal says it committed."""
        if self._done.holds(index):
            self.skipped += 1
        else:
            rows.append(row)
            indexes.append(index)

    def chunks(self, rows: Iterable[Any]) -> Iterator[Any]:
        """The units of ``rows``, pulled one chunk at a time, as the runner asks for the next."""
        iterator, batch, index = iter(rows), self._batch, 0
        if not self._done.count and isinstance(rows, (list, tuple)):  # nothing to skip: slices, at C speed
            for start in range(0, len(rows), batch):
                taken = rows[start : start + batch]  # a list's slice is a new list already
                taken = taken if taken.__class__ is list else list(taken)
                yield self._make_unit(self._chunk(taken, range(start, start + len(taken))))
            return
        while True:
            if not self._done.count:  # nothing to skip: the chunk's indexes follow on
                taken = list(islice(iterator, batch))
                indexes: Sequence[int] = range(index, index + len(taken))
                index += len(taken)
            else:
                taken, indexes = [], []
                for row in iterator:
                    self._taken(index, row, taken, indexes)
                    index += 1
                    if len(taken) == batch:
                        break
            if not taken:
                return
            yield self._make_unit(self._chunk(taken, indexes))

    async def chunks_async(self, rows: AsyncIterable[Any]) -> AsyncIterator[Any]:
        """As :meth:`chunks`, for an async iterable."""
        iterator, batch, index = aiter(rows), self._batch, 0
        while True:
            taken: list[Any] = []
            indexes: list[int] = []
            async for row in iterator:
                self._taken(index, row, taken, indexes)
                index += 1
                if len(taken) == batch:
                    break
            if not taken:
                return
            yield self._make_unit(self._chunk(taken, indexes))


def _single(key: str) -> Callable[[Any], tuple[Any, ...]]:
    """``itemgetter(key)``, returning a tuple of one value as ``itemgetter`` of several keys does."""

    def get(row: Any) -> tuple[Any, ...]:
        return (row[key],)

    return get
