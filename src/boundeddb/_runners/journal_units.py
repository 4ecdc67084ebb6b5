"""
One ``map()`` call's use of a :class:`~boundeddb.Journal`: its items' keys looked up in chunks, and
units that write their journal row in their own transaction.

:doc:`/explanation/architecture` places it; :doc:`/explanation/guarantees` says what it promises.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any, Final

import anyio
import anyio.to_thread
from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from .._core.attempts import CommitUnknown, CommitVerified, UnitMisuse
from .._core.journalled import SKIPPED, Foregone
from .._dialects import Dialect
from .._errors import BoundedDBError, UnitMisuseError
from .._journal import KEY_LENGTH, Journal, journal_table
from .items import BoundItem, units_of

__all__ = ["FIRST_CHUNK", "LAST_CHUNK", "JournalCall", "JournalRows", "check_journal", "map_units"]

logger = logging.getLogger("boundeddb.journal")

#: Keys looked up by the first query of a call. Each next query looks up twice as many, up to
#: :data:`LAST_CHUNK`: the first units start soon, and a long job costs one query per 500 items.
#: While every key of a chunk is done, as in a resume, chunks grow on up to what the database
#: takes in one query (``Dialect.most_keys_looked_up``).
FIRST_CHUNK: Final = 32
LAST_CHUNK: Final = 500
#: Seconds the probe of a lost COMMIT waits for the row lock of the unit's own transaction.
PROBE_WAIT_S: Final = 10


def map_units(
    fn: object,
    items: object,
    journal: object,
    runner: str,
    engine: Engine,
    dialect: Dialect,
    *,
    async_units: bool,
) -> Iterable[Any] | AsyncIterable[Any]:
    """``map(fn, items)``'s units on ``runner``, through ``journal`` unless it is None."""
    units = units_of(fn, items, runner)  # checks fn and items
    if journal is None:
        return units
    call = JournalCall.on(check_journal(journal, runner), engine, dialect, async_units=async_units)
    return call.units(fn, items)  # type: ignore[arg-type]


def check_journal(journal: object, runner: str) -> Journal[Any]:
    """``journal`` if it is a :class:`~boundeddb.Journal`, else a TypeError that says how to make one."""
    if not isinstance(journal, Journal):
        msg = (
            f"journal must be a boundeddb.Journal, got {type(journal).__name__}: pass e.g. "
            f'journal=Journal("my-job", key=lambda item: item.id) to {runner}.map()'
        )
        raise TypeError(msg)
    return journal


class JournalRows:
    """A job's rows in its journal table, on one engine: the SQL a call and its units run."""

    def __init__(
        self, job: str, table: str, engine: Engine, dialect: Dialect, *, async_units: bool, create_table: bool
    ) -> None:
        self.job = job
        self._engine = engine
        self._async_engine = AsyncEngine(engine) if async_units else None
        self._dialect = dialect
        self._table = journal_table(table)
        #: The journal table's name.
        self.table = table
        self._create_table = create_table
        #: The statement each unit runs first, in its own transaction.
        self.insert = self._table.insert()
        self._lookup = dialect.journal_lookup(self._table)
        #: The most keys one lookup asks for: see ``Dialect.most_keys_looked_up``.
        self.most_keys = dialect.most_keys_looked_up
        self._checked = False

    # -- the queries -------------------------------------------------------------------------------

    async def done(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have a row: one query, on a connection of the runner's engine."""
        if self._async_engine is not None:
            async with self._async_engine.connect() as connection:
                return await connection.run_sync(self._done_on, keys)
        return await anyio.to_thread.run_sync(self._done_sync, keys)

    def _done_sync(self, keys: list[str]) -> set[str]:
        with self._engine.connect() as connection:
            return self._done_on(connection, keys)

    def _done_on(self, connection: Connection, keys: list[str]) -> set[str]:
        if not self._checked:
            self._check_table(connection)
        done = {row[0] for row in connection.execute(self._lookup, {"job": self.job, "keys": keys})}
        connection.rollback()
        return done

    def _check_table(self, connection: Connection) -> None:
        """Create the table if it is missing and the journal may, else raise an error with its DDL."""
        table = self._table
        if not sa_inspect(connection).has_table(table.name):
            connection.rollback()
            ddl = Journal.ddl(self._engine, table=table.name)
            if not self._create_table:
                msg = (
                    f"Journal {self.job!r}: the table {table.name!r} does not exist and "
                    f"create_table=False: create it, e.g. in a migration, with\n\n{ddl}\n"
                )
                raise BoundedDBError(msg)
            try:
                with connection.begin():
                    table.create(connection, checkfirst=True)
            except sa_exc.DBAPIError as error:
                msg = (
                    f"Journal {self.job!r}: the table {table.name!r} does not exist and could not be "
                    f"created ({type(error.orig).__name__}: {error.orig}): have it created, e.g. in a "
                    f"migration, with\n\n{ddl}\n"
                )
                raise BoundedDBError(msg) from error
        self._checked = True

    # -- a lost COMMIT -------------------------------------------------------------------------------

    async def probe_async(self, key: str, unknown: CommitUnknown) -> Exception:
        """:class:`CommitVerified` if the key's row says what became of a lost COMMIT, else ``unknown``."""
        assert self._async_engine is not None
        try:
            with anyio.fail_after(PROBE_WAIT_S + 5):
                async with self._async_engine.connect() as connection:
                    committed = await connection.run_sync(self._probe_on, key)
        except Exception as error:
            return self._unresolved(key, unknown, error)
        return self._resolved(key, unknown, committed)

    def probe_sync(self, key: str, unknown: CommitUnknown) -> Exception:
        """As :meth:`probe_async`, in the unit's worker thread."""
        try:
            with self._engine.connect() as connection:
                committed = self._probe_on(connection, key)
        except Exception as error:
            return self._unresolved(key, unknown, error)
        return self._resolved(key, unknown, committed)

    def _probe_on(self, connection: Connection, key: str) -> bool:
        """
        Whether the key's row committed: try to insert it in a transaction that is rolled back.

        A unit's transaction still open on the server holds the row's lock, so the INSERT waits for
        it to end, at most :data:`PROBE_WAIT_S`: a duplicate key then means it committed.
        """
        dialect = self._dialect
        try:
            transaction = connection.begin()
            lock_wait = dialect.lock_wait_sql(PROBE_WAIT_S)
            if lock_wait is not None:
                connection.exec_driver_sql(lock_wait)
            try:
                connection.execute(self.insert, {"job": self.job, "item_key": key})
            except sa_exc.IntegrityError:
                committed = True
            else:
                committed = False
            transaction.rollback()
            return committed
        finally:
            if dialect.lock_wait_outlives_transaction:
                connection.invalidate()

    def _resolved(self, key: str, unknown: CommitUnknown, committed: bool) -> CommitVerified:
        verdict = "committed" if committed else "did not commit"
        logger.info("journal %r key %r: a COMMIT whose connection was lost %s", self.job, key, verdict)
        return CommitVerified(unknown.error, committed=committed, value=unknown.value)

    def _unresolved(self, key: str, unknown: CommitUnknown, error: Exception) -> CommitUnknown:
        logger.warning(
            "journal %r key %r: a COMMIT whose connection was lost stays unknown (%s): a rerun resolves it",
            self.job,
            key,
            type(error).__qualname__,
        )
        return unknown


class JournalCall:
    """What a ``map()`` call with ``journal=`` shares: its rows, and the keys it handed out."""

    def __init__(self, journal: Journal[Any], rows: JournalRows, *, async_units: bool) -> None:
        self.journal = journal
        self.job = journal.job
        self.rows = rows
        #: Keys handed out in this call: a key seen twice is refused, see :meth:`_settle_key`.
        self._seen: set[str] = set()
        self._item_type: type[JournalItem] = AsyncJournalItem if async_units else SyncJournalItem

    @classmethod
    def on(cls, journal: Journal[Any], engine: Engine, dialect: Dialect, *, async_units: bool) -> JournalCall:
        """A call of ``journal`` on ``engine``, the runner's own."""
        rows = JournalRows(
            journal.job,
            journal.table,
            engine,
            dialect,
            async_units=async_units,
            create_table=journal.create_table,
        )
        return cls(journal, rows, async_units=async_units)

    # -- the units ---------------------------------------------------------------------------------

    def units(self, fn: Callable[..., Any], items: Iterable[Any] | AsyncIterable[Any]) -> JournalUnits:
        """
        The call's units: for each item, its journalled unit, :data:`SKIPPED` if its row exists, or a
        :class:`Foregone` failure if its key is wrong.
        """
        return JournalUnits(self._units(fn, items), prompt=not isinstance(items, AsyncIterable))

    async def _units(
        self, fn: Callable[..., Any], items: Iterable[Any] | AsyncIterable[Any]
    ) -> AsyncIterator[Any]:
        make = self._item_type
        async for keyed in self.keyed(items):
            yield make(fn, keyed[0], keyed[1], self.rows) if isinstance(keyed, tuple) else keyed

    async def keyed(
        self, items: Iterable[Any] | AsyncIterable[Any]
    ) -> AsyncIterator[tuple[Any, str] | Foregone]:
        """
        ``(item, key)`` for each item to run, :data:`SKIPPED` for each whose row exists, or a
        :class:`Foregone` failure for each whose key is wrong, in input order.

        The keys are looked up in chunks of :data:`FIRST_CHUNK` to :data:`LAST_CHUNK` items, one query
        each. An async input is read a chunk ahead: one that yields an item only once an earlier
        item's unit settled would wait for itself.
        """
        sync_items = None if isinstance(items, AsyncIterable) else iter(items)
        async_items = aiter(items) if isinstance(items, AsyncIterable) else None
        size = FIRST_CHUNK
        while True:
            chunk: list[Any] = []
            if sync_items is not None:
                for item in sync_items:
                    chunk.append(item)
                    if len(chunk) == size:
                        break
            else:
                assert async_items is not None
                async for item in async_items:
                    chunk.append(item)
                    if len(chunk) == size:
                        break
            if not chunk:
                return
            keys = [self._settle_key(item) for item in chunk]
            wanted = [key for key in keys if key.__class__ is str]
            # Shielded: a deadline of a batch's pull must not end this generator mid-query.
            with anyio.CancelScope(shield=True):
                done = await self.rows.done(wanted) if wanted else set()
            for item, key in zip(chunk, keys, strict=True):
                if key.__class__ is not str:
                    yield key  # type: ignore[misc]
                elif key in done:
                    yield SKIPPED
                else:
                    yield item, key
            # Only done items, as in a resume: the next chunk may grow past LAST_CHUNK.
            most = self.rows.most_keys if len(done) == len(chunk) else LAST_CHUNK
            size = min(2 * size, most)

    def _settle_key(self, item: Any) -> str | Foregone:
        """The item's key as the table keeps it, or its outcome if ``key(item)`` fails or is wrong."""
        try:
            key = self.journal.key(item)
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


class JournalUnits:
    """A journalled call's units, and whether the run may pull them as ``Run.prompt`` says."""

    __slots__ = ("_units", "prompt")

    def __init__(self, units: AsyncIterator[Any], *, prompt: bool) -> None:
        self._units = units
        #: Over a plain iterable: only the key lookups await.
        self.prompt = prompt

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._units


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
        rows = self.rows
        await (await session.connection()).execute(rows.insert, {"job": rows.job, "item_key": self.key})
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
        rows = self.rows
        session.connection().execute(rows.insert, {"job": rows.job, "item_key": self.key})
        return self.fn(session, self.item)

    def probe_sync(self, unknown: CommitUnknown) -> Exception:
        """What became of this unit's lost COMMIT, by its key: see :meth:`JournalRows.probe_sync`."""
        return self.rows.probe_sync(self.key, unknown)
