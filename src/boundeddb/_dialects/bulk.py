"""
What every bulk writer of ``load()`` shares: the chunk's savepoint, ``insert(table)`` with a list of
rows (which psycopg2 and MySQL's drivers send as multi-row ``INSERT`` statements), and one
``INSERT`` compiled once and run by the driver's ``executemany()`` (MySQL and MariaDB). The ``COPY``
writers are in ``bulk_copy``, SQLite's in ``bulk_sqlite``; ``writers`` chooses one for a driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, overload

from sqlalchemy import Table, insert
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.ext.asyncio import AsyncConnection

from .refusals import Refused, is_refused_row

__all__ = [
    "RESET_SAVEPOINT",
    "ROLLBACK_TO_SAVEPOINT",
    "SET_SAVEPOINT",
    "BulkWriter",
    "ExecutemanyWriter",
    "FlatRows",
    "pooled",
]

#: The savepoint of a chunk's attempts, and what sets it and rolls back to it.
SAVEPOINT: Final = "boundeddb_rows"
SET_SAVEPOINT: Final = f"SAVEPOINT {SAVEPOINT}"
ROLLBACK_TO_SAVEPOINT: Final = f"ROLLBACK TO SAVEPOINT {SAVEPOINT}"
#: On PostgreSQL, in one round trip: the savepoint set again without nesting one more level.
RESET_SAVEPOINT: Final = f"RELEASE SAVEPOINT {SAVEPOINT}; {SET_SAVEPOINT}"


class FlatRows(Sequence[tuple[Any, ...]]):
    """
    Records as one list of their values, row after row, ``width`` values a row: what a multi-row
    ``INSERT`` binds, made for a writer that :attr:`~BulkWriter.takes_flat` without a tuple for each
    row (no allocation a row, so no garbage collection either). A sequence of the records otherwise.
    """

    __slots__ = ("values", "width")

    def __init__(self, values: list[Any], width: int) -> None:
        self.values = values
        self.width = width

    def __len__(self) -> int:
        return len(self.values) // self.width

    @overload
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[Any, ...]]: ...
    def __getitem__(self, index: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        if isinstance(index, slice):
            return self.records()[index]
        row, width = range(len(self))[index], self.width
        return tuple(self.values[row * width : (row + 1) * width])

    def records(self) -> list[tuple[Any, ...]]:
        """The records, a tuple each."""
        return list(zip(*[iter(self.values)] * self.width, strict=True))

    def spans(self, spans: tuple[tuple[int, int], ...]) -> FlatRows:
        """The rows of ``spans`` (``(start, stop)`` row offsets), in order: itself if they are all of it."""
        width = self.width
        if len(spans) == 1:
            start, stop = spans[0]
            if start == 0 and stop == len(self):
                return self
        values: list[Any] = []
        for start, stop in spans:
            values += self.values[start * width : stop * width]
        return FlatRows(values, width)


def pooled(connection: AsyncConnection) -> Any:
    """
    The pooled connection of ``connection``, which the chunk's transaction has begun on: taken
    without ``get_raw_connection()``'s hop into a greenlet, once per attempt.
    """
    return connection.sync_connection.connection  # type: ignore[union-attr]


class BulkWriter:
    """
    Writes records of one shape into a table: ``insert(table)`` with many rows, the default.

    It also sets the one savepoint that a chunk's attempts roll back to: :meth:`savepoint_async` once
    before the first attempt and again after each attempt that passed, :meth:`rollback_async` after
    each that was refused (the savepoint stays).
    """

    #: Whether the writer takes records (values in column order, processed), not ``insert()``'s parameters.
    takes_records = False
    #: Whether the writer takes records as :class:`FlatRows` where a chunk can make them so.
    takes_flat = False

    def __init__(self, dialect: SADialect) -> None:
        self._dialect = dialect

    async def savepoint_async(self, connection: AsyncConnection, *, again: bool) -> None:
        """Set the chunk's savepoint; ``again`` after an attempt passed, the savepoint set before it."""
        await connection.exec_driver_sql(SET_SAVEPOINT)

    async def rollback_async(self, connection: AsyncConnection) -> None:
        """Undo what the transaction did since the savepoint, which stays set."""
        await connection.exec_driver_sql(ROLLBACK_TO_SAVEPOINT)

    def savepoint_sync(self, connection: Connection, *, again: bool) -> None:
        """As :meth:`savepoint_async`, on a sync connection."""
        connection.exec_driver_sql(SET_SAVEPOINT)

    def rollback_sync(self, connection: Connection) -> None:
        """As :meth:`rollback_async`, on a sync connection."""
        connection.exec_driver_sql(ROLLBACK_TO_SAVEPOINT)

    def _refused_or_raise(self, error: Exception, line: int | None = None) -> Refused:
        if is_refused_row(error):
            return Refused(error, line)
        raise error

    async def write_async(
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        """Write ``rows`` on ``connection``; :class:`Refused` if the database refuses one for its data."""
        try:
            await connection.execute(insert(table), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None

    def write_sync(
        self, connection: Connection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        """As :meth:`write_async`, on a sync connection."""
        try:
            connection.execute(insert(table), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None


class ExecutemanyWriter(BulkWriter):
    """
    One ``INSERT`` of a row's placeholders, run by the driver's ``executemany()`` with the records:
    MySQL's drivers send them as multi-row ``INSERT`` statements, sqlite3 as one prepared statement.
    SQLAlchemy has processed the values already; it is not asked again for every row.
    """

    takes_records = True

    def __init__(self, dialect: SADialect) -> None:
        super().__init__(dialect)
        self._placeholder = "?" if dialect.paramstyle == "qmark" else "%s"
        self._statements: dict[tuple[str, ...], str] = {}

    def _head(self, table: Table, names: Sequence[str]) -> str:
        """``INSERT INTO table (names)``: the statement before its ``VALUES``."""
        preparer = self._dialect.identifier_preparer
        return f"INSERT INTO {preparer.format_table(table)} ({', '.join(map(preparer.quote, names))})"

    def _marks(self, names: Sequence[str]) -> str:
        """One row's placeholders, in parentheses."""
        return f"({', '.join(self._placeholder for _ in names)})"

    def _statement(self, table: Table, names: Sequence[str]) -> str:
        statement = self._statements.get(tuple(names))
        if statement is None:
            statement = f"{self._head(table, names)} VALUES {self._marks(names)}"
            self._statements[tuple(names)] = statement
        return statement

    async def write_async(
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        try:
            await connection.exec_driver_sql(self._statement(table, names), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None

    def write_sync(
        self, connection: Connection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        try:
            connection.exec_driver_sql(self._statement(table, names), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None
