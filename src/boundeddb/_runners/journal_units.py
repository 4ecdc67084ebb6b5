"""
One ``map()`` call's use of a :class:`~boundeddb.Journal`: its items' keys looked up in chunks, and
units that write their journal row in their own transaction.

:doc:`/explanation/architecture` places it; :doc:`/explanation/guarantees` says what it promises.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from itertools import islice
from typing import Any, Final, Protocol

from sqlalchemy.engine import Engine

from .._core.attempts import Attempts, CommitUnknown, UnitMisuse
from .._core.journalled import SKIPPED, Foregone, JournalChunks
from .._dialects import Dialect
from .._errors import UnitMisuseError
from .._journal import KEY_LENGTH, Journal
from .items import BoundItem, units_of
from .journal_rows import JournalRows

__all__ = ["FIRST_CHUNK", "LAST_CHUNK", "JournalCall", "KeyLookups", "check_journal", "map_units"]

#: Keys looked up by the first query of a call. Each next query looks up twice as many, up to
#: :data:`LAST_CHUNK`: the first units start soon, and a long job costs one query per 500 items.
#: While every key of a chunk is done, as in a resume, chunks grow on up to what the database
#: takes in one query (``Dialect.most_keys_looked_up``).
FIRST_CHUNK: Final = 32
LAST_CHUNK: Final = 500


class KeyLookups(Protocol):
    """
    Which keys of a job have a row: a :class:`JournalRows`, or a ProcessRunner's workers. Each
    lookup is retried as the runner's policy retries a unit; what it raises stops the call.
    """

    #: The most keys one lookup asks for.
    most_keys: int

    async def done(self, keys: list[str]) -> set[str]: ...


def map_units(
    fn: object,
    items: object,
    journal: object,
    runner: str,
    engine: Engine,
    dialect: Dialect,
    attempts: Attempts,
    *,
    async_units: bool,
) -> Iterable[Any] | AsyncIterable[Any] | JournalChunks:
    """
    ``map(fn, items)``'s units on ``runner``, through ``journal`` unless it is None. Sync units'
    worker threads pull a plain iterable themselves, and look its keys up as they do. ``attempts``:
    the runner's retry rule, which the lookups are tried by.
    """
    units = units_of(fn, items, runner)  # checks fn and items
    if journal is None:
        return units
    call = JournalCall.on(check_journal(journal, runner), engine, dialect, attempts, async_units=async_units)
    return call.units(fn, items, in_threads=not async_units)  # type: ignore[arg-type]


def check_journal(journal: object, runner: str) -> Journal[Any]:
    """``journal`` if it is a :class:`~boundeddb.Journal` with a key, else an error that says what to do."""
    if not isinstance(journal, Journal):
        msg = (
            f"journal must be a boundeddb.Journal, got {type(journal).__name__}: pass e.g. "
            f'journal=Journal("my-job", key=lambda item: item.id) to {runner}.map()'
        )
        raise TypeError(msg)
    if journal.key is None:
        msg = (
            f"{runner}.map() names each item by Journal(key=...), and this journal has none: pass e.g. "
            f"Journal({journal.job!r}, key=lambda item: item.id)"
        )
        raise ValueError(msg)
    return journal


class JournalCall:
    """What a ``map()`` call with ``journal=`` shares: its rows, and the keys it handed out."""

    def __init__(
        self,
        journal: Journal[Any],
        rows: JournalRows | None,
        *,
        async_units: bool,
        lookups: KeyLookups | None = None,
    ) -> None:
        self.journal = journal
        self.job = journal.job
        assert journal.key is not None, "check_journal() refuses a journal without a key"
        self._key = journal.key
        #: The rows the units write: None where they are written elsewhere (a ProcessRunner's workers).
        self.rows = rows
        #: What looks the keys up: ``rows``, unless given.
        self.lookups: KeyLookups
        if lookups is not None:
            self.lookups = lookups
        else:
            assert rows is not None, "a call without rows looks its keys up elsewhere"
            self.lookups = rows
        #: Keys handed out in this call: a key seen twice is refused, see :meth:`_settle_key`.
        self._seen: set[str] = set()
        self._item_type: type[JournalItem] = AsyncJournalItem if async_units else SyncJournalItem

    @classmethod
    def on(
        cls, journal: Journal[Any], engine: Engine, dialect: Dialect, attempts: Attempts, *, async_units: bool
    ) -> JournalCall:
        """A call of ``journal`` on ``engine``, the runner's own, its lookups tried by ``attempts``."""
        rows = JournalRows(
            journal.job,
            journal.table,
            engine,
            dialect,
            attempts,
            async_units=async_units,
            create_table=journal.create_table,
        )
        return cls(journal, rows, async_units=async_units)

    # -- the units ---------------------------------------------------------------------------------

    def units(
        self, fn: Callable[..., Any], items: Iterable[Any] | AsyncIterable[Any], *, in_threads: bool
    ) -> JournalChunks | AsyncIterator[Any]:
        """
        The call's units: for each item, its journalled unit, :data:`SKIPPED` if its row exists, or a
        :class:`Foregone` failure if its key is wrong. A plain iterable's come in :class:`JournalChunks`.

        ``in_threads``: the runner's worker threads pull a plain iterable themselves (as
        ThreadOffloadRunner's lanes do), so its keys are looked up in the thread that pulls.
        """
        make, rows = self._item_type, self.rows
        assert rows is not None, "the runner's own calls have rows"

        def unit(item: Any, key: str) -> JournalItem:
            return make(fn, item, key, rows)

        if isinstance(items, AsyncIterable):
            return self.looked_up(items, unit)
        if in_threads:
            chunks = JournalChunks(None, in_threads=True)
            chunks.chunks = self.chunks_sync(items, unit, chunks.stopped)
            return chunks
        return JournalChunks(self.chunks(items, unit), in_threads=False)

    def keyed(self, items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[tuple[Any, str] | Foregone]:
        """``(item, key)`` for each item to run, else its :class:`Foregone`: :meth:`looked_up`'s pairs."""
        return self.looked_up(items, _pair)

    async def looked_up(
        self, items: Iterable[Any] | AsyncIterable[Any], make: Callable[[Any, str], Any]
    ) -> AsyncIterator[Any]:
        """:meth:`chunks`, one item at a time."""
        async for chunk in self.chunks(items, make):
            for settled in chunk:
                yield settled

    async def chunks(
        self, items: Iterable[Any] | AsyncIterable[Any], make: Callable[[Any, str], Any]
    ) -> AsyncIterator[list[Any]]:
        """
        For each chunk of items: ``make(item, key)`` for each item to run, :data:`SKIPPED` for each
        whose row exists, or a :class:`Foregone` failure for each whose key is wrong, in input order.

        The keys are looked up in chunks of :data:`FIRST_CHUNK` to :data:`LAST_CHUNK` items, one query
        each, retried as a unit would be; what the last attempt raised ends the chunks. An async input
        is read a chunk ahead: one that yields an item only once an earlier item's unit settled would
        wait for itself.
        """
        sync_items = None if isinstance(items, AsyncIterable) else iter(items)
        async_items = aiter(items) if isinstance(items, AsyncIterable) else None
        size = FIRST_CHUNK
        while True:
            chunk: list[Any] = []
            if sync_items is not None:
                chunk = list(islice(sync_items, size))
            else:
                assert async_items is not None
                async for item in async_items:
                    chunk.append(item)
                    if len(chunk) == size:
                        break
            if not chunk:
                return
            keys, wanted = self._keys(chunk)
            done = await self.lookups.done(wanted) if wanted else _NONE_DONE  # each attempt shielded
            yield self._settled(chunk, keys, done, make)
            size = _next_size(size, len(done) == len(chunk), self.lookups.most_keys)

    def chunks_sync(
        self, items: Iterable[Any], make: Callable[[Any, str], Any], stopped: Callable[[], bool]
    ) -> Iterator[list[Any]]:
        """
        As :meth:`chunks`, for a plain iterable, in the calling thread: it blocks on each lookup, and
        a lookup backs off between attempts until ``stopped()``.
        """
        rows = self.rows
        assert rows is not None, "a thread runner's own call: its rows look its keys up"
        iterator = iter(items)
        size = FIRST_CHUNK
        while chunk := list(islice(iterator, size)):
            keys, wanted = self._keys(chunk)
            done = rows.done_sync(wanted, stopped) if wanted else _NONE_DONE
            yield self._settled(chunk, keys, done, make)
            size = _next_size(size, len(done) == len(chunk), rows.most_keys)

    def _keys(self, chunk: list[Any]) -> tuple[list[str | Foregone], list[str]]:
        """The chunk's keys (or outcomes, for items whose key is wrong), and those to look up."""
        keys = [self._settle_key(item) for item in chunk]
        return keys, [key for key in keys if key.__class__ is str]

    @staticmethod
    def _settled(
        chunk: list[Any], keys: list[str | Foregone], done: set[str], make: Callable[[Any, str], Any]
    ) -> list[Any]:
        """What :meth:`looked_up` yields for each item of ``chunk``, once its keys were looked up."""
        return [
            key if key.__class__ is not str else SKIPPED if key in done else make(item, key)
            for item, key in zip(chunk, keys, strict=True)
        ]

    def _settle_key(self, item: Any) -> str | Foregone:
        """The item's key as the table keeps it, or its outcome if ``key(item)`` fails or is wrong."""
        try:
            key = self._key(item)
        except Exception as error:  # that item's failure, as the issue of its own unit would be
            return Foregone(error)
        if key.__class__ is str:
            text: str = key
        elif isinstance(key, int) and not isinstance(key, bool):
            text = str(int(key))
        elif isinstance(key, str):
            text = str(key)
        else:
            return Foregone(
                UnitMisuseError(
                    f"Journal {self.job!r}: key(item) returned {key!r} ({type(key).__name__}) for item "
                    f"{item!r}: a key must be a str or an int that names the item within the job"
                )
            )
        if len(text) > KEY_LENGTH:
            return Foregone(
                UnitMisuseError(
                    f"Journal {self.job!r}: the key {text[:40]!r}... is {len(text)} characters long: "
                    f"a key must be at most {KEY_LENGTH} characters, e.g. a hash of a longer one"
                )
            )
        if text in self._seen:
            return Foregone(
                UnitMisuseError(
                    f"Journal {self.job!r}: the key {text!r} names two items of this run, the second of them "
                    f"{item!r}: keys must be unique within a job, or the second would be skipped as done"
                )
            )
        self._seen.add(text)
        return text


#: No key done: what a chunk of only foregone items looks up.
_NONE_DONE: Final[set[str]] = set()


def _pair(item: Any, key: str) -> tuple[Any, str]:
    return item, key


def _next_size(size: int, all_done: bool, most_keys: int) -> int:
    """The next chunk's size: twice this one's, up to :data:`LAST_CHUNK`, or further while all were done."""
    return min(2 * size, most_keys if all_done else LAST_CHUNK)


class JournalItem(BoundItem):
    """``fn(session, item)`` that writes the item's journal row first, in the same transaction."""

    __slots__ = ("key", "rows")

    def __init__(self, fn: Callable[..., Any], item: Any, key: str, rows: JournalRows) -> None:
        self.fn = fn
        self.item = item
        self.key = key
        self.rows = rows


class AsyncJournalItem(JournalItem):
    """A :class:`JournalItem` for ``async def fn(session, item)``."""

    __slots__ = ()

    def __call__(self, session: Any) -> Any:
        return self._run(session)

    async def _run(self, session: Any) -> Any:
        # First: a rerun racing a transaction still open on the server waits for its row lock.
        await self.rows.write_async(session, self.key)
        result = self.fn(session, self.item)
        if not inspect.isawaitable(result):  # as the executor says of a unit without a journal
            msg = (
                f"fn returned {type(result).__name__}, not an awaitable, for the item of key {self.key!r}: "
                "this runner runs `async def fn(session: AsyncSession, item)`; "
                "run plain functions with ThreadOffloadRunner"
            )
            raise UnitMisuse(msg)
        return await result

    async def probe_async(self, unknown: CommitUnknown) -> Exception:
        """What became of this unit's lost COMMIT, by its key: see :meth:`JournalRows.probe_async`."""
        return await self.rows.probe_async(self.key, unknown)


class SyncJournalItem(JournalItem):
    """A :class:`JournalItem` for ``def fn(session, item)``, in a worker thread."""

    __slots__ = ()

    def __call__(self, session: Any) -> Any:
        self.rows.write_sync(session, self.key)
        return self.fn(session, self.item)

    def probe_sync(self, unknown: CommitUnknown) -> Exception:
        """What became of this unit's lost COMMIT, by its key: see :meth:`JournalRows.probe_sync`."""
        return self.rows.probe_sync(self.key, unknown)
