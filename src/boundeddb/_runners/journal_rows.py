"""
A job's rows in its journal table: the lookups of a ``map()`` call's keys and of a load's positions,
each retried as the runner's policy retries a unit, the table's check, and the probe of a lost COMMIT.

``journal_units.py`` uses them; :doc:`/explanation/architecture` tells how the journal works.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
from sqlalchemy import bindparam, select
from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from .._core.attempts import Attempts, CommitUnknown, CommitVerified, ConnectFailed
from .._core.limiter import Slot
from .._dialects import Dialect
from .._errors import BoundedDBError
from .._journal import Journal, journal_table, untranslated

__all__ = ["PROBE_WAIT_S", "JournalRows"]

logger = logging.getLogger("boundeddb.journal")

#: Seconds the probe of a lost COMMIT waits for the row lock of the unit's own transaction.
PROBE_WAIT_S: Final = 10

#: What a lookup is called in the retry log.
_LOOKUP: Final = "a journal's lookup"

T = TypeVar("T")


class JournalRows:
    """A job's rows in its journal table, on one engine: the SQL a call and its units run."""

    def __init__(
        self,
        job: str,
        table: str,
        engine: Engine,
        dialect: Dialect,
        attempts: Attempts,
        *,
        async_units: bool,
        create_table: bool,
    ) -> None:
        """``attempts``: the runner's retry rule, which each lookup is tried by, as a unit would be."""
        self.job = job
        self._attempts = attempts
        self._engine = engine = untranslated(engine)
        self._async_engine = AsyncEngine(engine) if async_units else None
        self._dialect = dialect
        self._table = journal_table(table)
        #: The journal table's name.
        self.table = table
        self._create_table = create_table
        #: The key's row, inserted: what the probe of a lost COMMIT tries.
        self.insert = self._table.insert()
        # Each unit's first statement, compiled once for the engine's dialect, so that a unit runs it
        # as its driver takes it: not once more through SQLAlchemy's statement cache.
        row = self._table.insert().values(job=bindparam("job"), item_key=bindparam("item_key"))
        compiled = row.compile(dialect=engine.dialect)
        self._row_sql = str(compiled)
        self._positional = compiled.positional
        assert not compiled.positional or compiled.positiontup == ["job", "item_key"], compiled.positiontup
        self._lookup = dialect.journal_lookup(self._table)
        #: The most keys one lookup asks for: see ``Dialect.most_keys_looked_up``.
        self.most_keys = dialect.most_keys_looked_up
        self._checked = False

    # -- a unit's row ------------------------------------------------------------------------------

    async def write_async(self, session: AsyncSession, key: str) -> None:
        """Insert ``key``'s row in ``session``'s transaction: a journalled unit's first statement."""
        parameters = (self.job, key) if self._positional else {"job": self.job, "item_key": key}
        await (await session.connection()).exec_driver_sql(self._row_sql, parameters)

    def write_sync(self, session: Session, key: str) -> None:
        """As :meth:`write_async`, on a sync ``session``."""
        parameters = (self.job, key) if self._positional else {"job": self.job, "item_key": key}
        session.connection().exec_driver_sql(self._row_sql, parameters)

    async def write_many_async(self, session: AsyncSession, keys: list[str]) -> None:
        """Insert a row for each of ``keys`` in ``session``'s transaction: a load's committed index runs."""
        await (await session.connection()).exec_driver_sql(self._row_sql, self._parameters(keys))

    def write_many_sync(self, session: Session, keys: list[str]) -> None:
        """As :meth:`write_many_async`, on a sync ``session``."""
        session.connection().exec_driver_sql(self._row_sql, self._parameters(keys))

    def _parameters(self, keys: list[str]) -> Any:
        """The rows' parameters: one row's alone, which the driver runs without its executemany()."""
        job = self.job
        if self._positional:
            rows: list[Any] = [(job, key) for key in keys]
        else:
            rows = [{"job": job, "item_key": key} for key in keys]
        return rows[0] if len(rows) == 1 else rows

    # -- the queries ---------------------------------------------------------------------------------
    #
    # Each lookup is retried by the runner's policy, as a unit is, each attempt on a connection of its
    # own: a failed one is returned to the pool, or discarded if it was lost, before the back-off.

    async def done(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have a row: one query, on a connection of the runner's engine."""
        return await self._attempts.retried(partial(self._attempt, self._done_on, keys), _LOOKUP)

    def done_sync(self, keys: list[str], stopped: Callable[[], bool]) -> set[str]:
        """As :meth:`done`, in the calling thread, which backs off until ``stopped()``."""
        attempt = partial(self._attempt_sync, self._done_on, keys)
        return self._attempts.retried_sync(attempt, _LOOKUP, stopped)

    async def keys_starting(self, prefix: str, slot: Slot | None = None) -> list[str]:
        """
        Every key of the job that starts with ``prefix``: one query, on a connection of the engine,
        within ``slot``, which is given back while it backs off.
        """
        return await self._attempts.retried(partial(self._attempt, self._keys_on, prefix), _LOOKUP, slot)

    async def _attempt(self, query: Callable[[Connection, T], Any], argument: T) -> Any:
        """One attempt of a lookup, on a connection of its own, shielded: a pull's deadline never cuts it."""
        if self._async_engine is None:
            return await anyio.to_thread.run_sync(self._attempt_sync, query, argument)
        with anyio.CancelScope(shield=True):
            connection = self._async_engine.connect()
            try:
                await connection.start()
            except Exception as error:  # nothing was sent: a retry is safe, as a unit's would be
                raise ConnectFailed(error) from error
            try:
                return await connection.run_sync(query, argument)
            finally:
                await connection.close()

    def _attempt_sync(self, query: Callable[[Connection, T], Any], argument: T) -> Any:
        """As :meth:`_attempt`, in the calling thread."""
        try:
            connection = self._engine.connect()
        except Exception as error:
            raise ConnectFailed(error) from error
        with connection:
            return query(connection, argument)

    def _keys_on(self, connection: Connection, prefix: str) -> list[str]:
        """:meth:`keys_starting`'s query, on ``connection``."""
        if not self._checked:
            self._check_table(connection)
        table = self._table
        query = select(table.c.item_key).where(
            table.c.job == self.job, table.c.item_key.startswith(prefix, autoescape=True)
        )
        keys = [str(key) for key in connection.execute(query).scalars()]
        connection.rollback()
        return keys

    def _done_on(self, connection: Connection, keys: list[str]) -> set[str]:
        """:meth:`done`'s query, on ``connection``."""
        if not self._checked:
            self._check_table(connection)
        done = self._dialect.done_keys(
            connection.execute(self._lookup, {"job": self.job, "keys": keys}), keys
        )
        connection.rollback()
        return done

    def _check_table(self, connection: Connection) -> None:
        """
        Create the table if it is missing and the journal may, else raise an error with its DDL: part
        of the first lookup, and retried with it. A transient error is raised as it is, to be retried.
        """
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
                if self._dialect.is_transient(error):  # a lost connection: the lookup's to retry
                    raise
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
