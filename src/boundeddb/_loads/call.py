"""
One ``load()`` call: its arguments checked, its chunks made (after the journal's lookup), and its
outcomes turned into a :class:`~boundeddb.LoadReport`.

:doc:`/explanation/loads` tells how a load works; the runners add only the verb.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, Iterable
from typing import Any, Final

from sqlalchemy.engine import Engine

from .._arguments import checked_iterable
from .._core.limiter import Slot
from .._core.recorder import Recorder
from .._core.run import Run
from .._core.sinks import ListSink
from .._dialects import Dialect
from .._dialects.writers import bulk_writer
from .._errors import LoadFailed
from .._outcome import ChunkResult, LoadReport, Outcome, RejectedRow
from .._stats import RunStats
from .chunks import Chunk, ChunkMaker
from .keys import KeyCheck
from .ranges import KEY_PREFIX, IndexRanges
from .references import ReferenceCheck
from .target import load_target
from .units import AsyncChunkUnit, ChunkSettings, FirstRefused, SyncChunkUnit

__all__ = ["DEFAULT_BATCH", "LoadCall"]

#: Rows per transaction unless ``batch=`` says otherwise: see :doc:`/how-to/load`.
DEFAULT_BATCH: Final = 5000


def check_load_batch(batch: object) -> int:
    """``batch`` if it is an int of at least 1, else an error that names it."""
    if isinstance(batch, bool) or not isinstance(batch, int):
        msg = (
            f"batch must be an int, the rows per transaction, got {batch!r}: pass e.g. batch={DEFAULT_BATCH}"
        )
        raise TypeError(msg)
    if batch < 1:
        msg = f"batch must be at least 1, the rows per transaction, got {batch}: pass e.g. batch=5000"
        raise ValueError(msg)
    return batch


def check_load_errors(errors: object) -> bool:
    """Whether ``errors`` asks to stop at the first refused row: ``"raise"``; ``"collect"`` is the default."""
    if errors not in ("collect", "raise"):
        msg = f'errors must be "collect" or "raise", got {errors!r}'
        raise ValueError(msg)
    return errors == "raise"


class RowsSink(ListSink):
    """
    Every chunk's outcome, from any thread, each committed chunk's rows counted in the recorder as it
    settles, so that ``statistics()`` shows them while the load runs: in the settling thread, not
    through an ``on_outcome`` hook, whose queue a thread runner's loop would have to drain.
    """

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._recorder = recorder

    def put(self, outcome: Outcome[Any]) -> None:
        value = outcome.value
        if value.__class__ is ChunkResult:
            self._recorder.rows_written(value.loaded, len(value.rejected))
        super().put(outcome)


class LoadCall:
    """What one ``load()`` call shares: its target, its writer, its journal and its chunks."""

    def __init__(
        self,
        engine: Engine,
        dialect: Dialect,
        target: object,
        rows: object,
        *,
        columns: object,
        batch: object,
        errors: object,
        journal: Any,
        async_units: bool,
    ) -> None:
        """Check every argument before any database work. ``journal``: the runner's JournalRows, or None."""
        self._target, names = load_target(target, columns)
        self._batch = check_load_batch(batch)
        raise_first = check_load_errors(errors)
        self._rows = checked_iterable(rows, "rows")
        self._rows_total = len(self._rows) if hasattr(self._rows, "__len__") else None  # type: ignore[arg-type]
        #: The journal's rows (``JournalRows``), made by the runner from ``journal=``, or None.
        self._journal = journal
        writer = bulk_writer(engine.dialect, self._target.table, self._target.needs_insert is not None)
        keys = references = None
        if writer.takes_records and not raise_first:  # with "raise", the first refused row ends the load
            keys = KeyCheck(self._target.table, engine.dialect)
            if engine.dialect.name == "postgresql":  # its errors name the foreign key
                references = ReferenceCheck(self._target.table, engine.dialect)
        settings = ChunkSettings(
            self._target, writer, self._journal, dialect, keys if keys and keys.usable else None,
            references if references and references.usable else None, raise_first=raise_first,
        )  # fmt: skip
        self._settings = settings
        self._names = names
        self._engine = engine
        self._writer = writer
        self._unit_type: type[AsyncChunkUnit | SyncChunkUnit] = (
            AsyncChunkUnit if async_units else SyncChunkUnit
        )
        self._maker: ChunkMaker | None = None
        #: The input positions the journal says committed before: :meth:`look_up`'s answer.
        self._done = IndexRanges()

    @property
    def chunks_total(self) -> range | None:
        """
        As many items as the call has chunks, if the rows have a length: the progress bar's total,
        once :meth:`units` knows the rows that the journal skips.
        """
        if self._rows_total is None:
            return None
        done = 0 if self._maker is None else self._maker.done_count
        return range(math.ceil(max(0, self._rows_total - done) / self._batch))

    def _unit(self, chunk: Chunk) -> AsyncChunkUnit | SyncChunkUnit:
        """The unit that writes ``chunk``."""
        return self._unit_type(chunk, self._settings)

    @property
    def journalled(self) -> bool:
        """Whether the call has a journal, to look up before its first chunk (:meth:`look_up`)."""
        return self._journal is not None

    async def look_up(self, slot: Slot) -> None:
        """
        Ask the journal which rows committed before, within ``slot``: one query, retried as the
        runner's policy retries a chunk, ``slot`` given back while it backs off. It raises what the
        last attempt raised: :meth:`lookup_failed` makes it the error that stops the load.
        """
        self._done = IndexRanges.from_keys(await self._journal.keys_starting(KEY_PREFIX, slot))

    def lookup_failed(self, error: Exception, stats: RunStats) -> LoadFailed:
        """The error that stops the load when its journal's lookup raised ``error``: no chunk ran."""
        first_line = next(iter(str(error).splitlines()), "")
        msg = (
            f"the load stopped before its first chunk: the lookup of journal {self._journal.job!r} failed "
            f"({type(error).__name__}: {first_line}); no row was loaded: rerun with the same journal "
            "once its cause is fixed"
        )
        return LoadFailed(msg, report=LoadReport(0, 0, [], 0, stats))

    def units(self) -> Iterable[Any] | AsyncIterable[Any]:
        """The call's chunk units, pulled lazily, after :meth:`look_up` if it has a journal."""
        dialect = self._engine.dialect
        maker = self._maker = ChunkMaker(
            self._target, self._names, self._batch, self._writer, dialect, self._done, self._unit
        )
        rows = self._rows
        if isinstance(rows, AsyncIterable):
            return maker.chunks_async(rows)
        return maker.chunks(rows)

    @staticmethod
    def sink(recorder: Recorder) -> RowsSink:
        """Where the call's outcomes go: a list, which counts each committed chunk's rows in ``recorder``."""
        return RowsSink(recorder)

    def report(self, outcomes: list[Outcome[Any]], stats: RunStats, run: Run[Any]) -> LoadReport:
        """The call's report, or the error that stopped it, raised with the report of what committed."""
        loaded = transactions = 0
        rejected: list[RejectedRow] = []
        first_failure: Outcome[Any] | None = None
        for outcome in outcomes:
            value = outcome.value
            if isinstance(value, ChunkResult):
                loaded += value.loaded
                rejected.extend(value.rejected)
                transactions += 1
            elif outcome.error is not None:
                if isinstance(outcome.error, FirstRefused):
                    rejected.append(outcome.error.rejected)
                if first_failure is None:
                    first_failure = outcome
        rejected.sort(key=lambda row: row.index)
        skipped = 0 if self._maker is None else self._maker.skipped
        report = LoadReport(loaded, skipped, rejected, transactions, stats)
        if run.input_error is not None:
            stopped = run.input_error
            if isinstance(stopped, (ValueError, TypeError)) and loaded:
                msg = f"{stopped} ({loaded} rows of earlier chunks were committed before it was found)"
                raise type(stopped)(msg) from stopped
            raise stopped
        if run.misuse is not None:
            raise run.misuse
        if first_failure is not None:
            error = first_failure.error
            assert error is not None
            if isinstance(error, FirstRefused):
                first = error.rejected
                msg = (
                    f'row {first.index} was refused ({type(first.error).__name__}) and errors="raise": '
                    f"{loaded} rows committed"
                )
                raise LoadFailed(msg, report=report) from first.error
            what = "its COMMIT's fate is unknown" if first_failure.commit_unknown else type(error).__name__
            then = (
                "rerun with the same journal to load the rest"
                if self._journal is not None
                else "the chunks that committed stay committed (pass journal= to resume a load)"
            )
            msg = f"the load stopped: a chunk of rows failed ({what}): {loaded} rows committed; {then}"
            raise LoadFailed(msg, report=report) from error
        return report
