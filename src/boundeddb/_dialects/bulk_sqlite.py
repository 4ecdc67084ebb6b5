"""
SQLite's bulk path for ``load()``: multi-row ``INSERT ... VALUES`` statements, and a chunk's
savepoint set only once an attempt needs one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Table
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.ext.asyncio import AsyncConnection

from .bulk import SET_SAVEPOINT, ExecutemanyWriter, FlatRows

__all__ = ["SQLITE_ROWS", "SqliteValuesWriter"]

#: In a connection's ``info``: the chunk's transaction has no savepoint yet.
_DEFERRED: Final = "boundeddb.load.savepoint_deferred"
#: What undoes a chunk's first attempt: its transaction rolled back and begun again, the savepoint set.
#: IMMEDIATE: the transaction had written, so it held the database's write lock; it takes it again.
_RESTART: Final = ("ROLLBACK", "BEGIN IMMEDIATE", SET_SAVEPOINT)

#: Rows per multi-row ``INSERT`` on SQLite (statements of 250 and of 8,000 rows were no faster when it
#: was chosen: ``docs/explanation/loads.md``), fewer where the statement's parameters would exceed the
#: build's limit: 32,766 since SQLite 3.32, 999 before.
SQLITE_ROWS: Final = 1000


class SqliteValuesWriter(ExecutemanyWriter):
    """
    SQLite: the rows go as multi-row ``INSERT ... VALUES (?, ...), (?, ...)`` statements of up to
    :data:`SQLITE_ROWS` rows, each one step of one statement, where sqlite3's ``executemany()`` steps
    its statement once per row. A statement is all or nothing, as ``executemany()`` is not; the
    savepoint undoes an attempt's earlier statements either way.

    A chunk's first attempt goes without the savepoint: while one is open, SQLite keeps the original
    of each page the statements change in a sub-journal, which made clean loads slower. If that
    attempt is refused, its transaction is rolled back and begun again, and the savepoint set. Only
    the chunk's reads (the key check) came before it.

    It takes a chunk's records as :class:`~boundeddb._dialects.bulk.FlatRows` where the chunk can be
    made so: a statement's parameters are then one slice of them.
    """

    takes_flat = True

    def __init__(self, dialect: SADialect) -> None:
        super().__init__(dialect)
        version = getattr(dialect.dbapi, "sqlite_version_info", (0,))
        #: The most parameters a statement may have; halved if the build allows fewer.
        self._parameters = 32766 if version >= (3, 32, 0) else 999
        #: The statements of a whole statement's rows, by the rows' column names and count.
        self._kept: dict[tuple[tuple[str, ...], int], str] = {}

    async def savepoint_async(self, connection: AsyncConnection, *, again: bool) -> None:
        if not again:  # a chunk's first attempt: none yet
            connection.info[_DEFERRED] = True
            return
        connection.info.pop(_DEFERRED, None)
        await connection.exec_driver_sql(SET_SAVEPOINT)

    async def rollback_async(self, connection: AsyncConnection) -> None:
        if not connection.info.pop(_DEFERRED, False):
            return await super().rollback_async(connection)
        for statement in _RESTART:
            await connection.exec_driver_sql(statement)

    def savepoint_sync(self, connection: Connection, *, again: bool) -> None:
        if not again:  # a chunk's first attempt: none yet
            connection.info[_DEFERRED] = True
            return
        connection.info.pop(_DEFERRED, None)
        connection.exec_driver_sql(SET_SAVEPOINT)

    def rollback_sync(self, connection: Connection) -> None:
        if not connection.info.pop(_DEFERRED, False):
            return super().rollback_sync(connection)
        for statement in _RESTART:
            connection.exec_driver_sql(statement)

    def _values(self, table: Table, names: Sequence[str], count: int, *, keep: bool) -> str:
        """
        The ``INSERT`` of ``count`` rows of ``names``: ``executemany()``'s, its values ``count`` times;
        kept if ``keep`` (a whole statement's rows), so that it is not joined and hashed again.
        """
        key = (tuple(names), count)
        statement = self._kept.get(key)
        if statement is None:
            statement = f"{self._head(table, names)} VALUES {', '.join([self._marks(names)] * count)}"
            if keep:
                self._kept[key] = statement
        return statement

    def _fewer(self, error: sa_exc.DBAPIError, parameters: int, rows: int) -> bool:
        """
        Whether ``error`` says that a statement of ``rows`` rows had too many ``parameters`` for this
        build, and fewer rows may go: the statement wrote nothing, and is sent again in halves.
        """
        if not isinstance(error, sa_exc.OperationalError) or "too many SQL variables" not in str(error.orig):
            return False
        self._parameters = min(self._parameters, parameters) // 2
        return rows > 1

    def _next(
        self, table: Table, names: Sequence[str], rows: Sequence[Any], start: int
    ) -> tuple[str, tuple[Any, ...], int]:
        """The statement, parameters and number of the rows of ``rows`` it sends from ``start``."""
        per = max(1, min(SQLITE_ROWS, self._parameters // len(names)))
        if isinstance(rows, FlatRows):
            width = rows.width
            values = rows.values[start * width : (start + per) * width]
            count = len(values) // width
            return self._values(table, names, count, keep=count == per), tuple(values), count
        part = rows[start : start + per]
        return self._values(table, names, len(part), keep=len(part) == per), _flat(part), len(part)

    async def write_async(
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        start = 0
        if not names:  # no column named: as ``executemany()`` would fail
            return await super().write_async(connection, table, names, rows)
        while start < len(rows):
            statement, parameters, count = self._next(table, names, rows, start)
            try:
                await connection.exec_driver_sql(statement, parameters)
            except sa_exc.DBAPIError as error:
                if self._fewer(error, len(parameters), count):
                    continue
                raise self._refused_or_raise(error) from None
            start += count

    def write_sync(
        self, connection: Connection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        start = 0
        if not names:  # no column named: as ``executemany()`` would fail
            return super().write_sync(connection, table, names, rows)
        while start < len(rows):
            statement, parameters, count = self._next(table, names, rows, start)
            try:
                connection.exec_driver_sql(statement, parameters)
            except sa_exc.DBAPIError as error:
                if self._fewer(error, len(parameters), count):
                    continue
                raise self._refused_or_raise(error) from None
            start += count


def _flat(records: Sequence[Any]) -> tuple[Any, ...]:
    """The values of ``records``, one after another: a statement's parameters."""
    values: list[Any] = []
    extend = values.extend
    for record in records:  # a list grown at C speed: tuple(chain(...)) grows a tuple, slower
        extend(record)
    return tuple(values)
