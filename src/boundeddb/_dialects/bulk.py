"""
The bulk statement of each driver that ``load()`` writes rows with, and what its errors say.

PostgreSQL's drivers ``COPY``: asyncpg's ``copy_records_to_table()`` (binary), psycopg 3's
``cursor.copy()`` (text), sync and async, psycopg2's ``copy_expert()`` (text, for tables of the
column types ``copy_text`` writes). Every other driver, and a target whose Python defaults
only an ``INSERT`` can compute, runs ``insert(table)`` with a list of rows, which the drivers send as
multi-row ``INSERT`` statements (MySQL's, psycopg2's) or one prepared statement (SQLite); on
MySQL, MariaDB and SQLite the statement is compiled once and run by the driver's ``executemany()``.
:doc:`/explanation/loads` has the measurements behind the choice.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Table, insert
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.ext.asyncio import AsyncConnection

from .copy_text import copies_as_text, text_line
from .postgresql import sqlstate

__all__ = ["BulkWriter", "Refused", "bulk_writer", "is_duplicate_key"]

#: SQLSTATEs of a row refused for its own values, the row named by the COPY's error context. A foreign
#: key's and a deferred constraint's checks run at the end of the statement, where no line is known.
_ROW_SQLSTATES: Final = frozenset({"23502", "23505", "23514", "23P01"})
_COPY_LINE: Final = re.compile(r"^COPY .*?, line (\d+)")
#: MySQL and MariaDB error numbers of a row refused for its data: duplicate key (1062), NULL in a NOT
#: NULL column (1048, 1364), too long or out of range (1406, 1264, 1690), wrong value (1265, 1292,
#: 1366, 1411), foreign key (1216, 1452), CHECK (3819, MariaDB 4025).
_MYSQL_ROW_ERRORS: Final = frozenset(
    {1048, 1062, 1216, 1264, 1265, 1292, 1364, 1366, 1406, 1411, 1452, 1690, 3819, 4025}
)


#: The savepoint of a chunk's attempts, and what sets it and rolls back to it.
SAVEPOINT: Final = "boundeddb_rows"
SET_SAVEPOINT: Final = f"SAVEPOINT {SAVEPOINT}"
ROLLBACK_TO_SAVEPOINT: Final = f"ROLLBACK TO SAVEPOINT {SAVEPOINT}"
#: On PostgreSQL, in one round trip: the savepoint set again without nesting one more level.
RESET_SAVEPOINT: Final = f"RELEASE SAVEPOINT {SAVEPOINT}; {SET_SAVEPOINT}"


def _pooled(connection: AsyncConnection) -> Any:
    """
    The pooled connection of ``connection``, which the chunk's transaction has begun on: taken
    without ``get_raw_connection()``'s hop into a greenlet, once per attempt.
    """
    return connection.sync_connection.connection  # type: ignore[union-attr]


class Refused(Exception):
    """A bulk statement's rows were refused for their data: ``error`` says why, ``line`` which row from 1."""

    def __init__(self, error: Exception, line: int | None) -> None:
        super().__init__(error, line)
        self.error = error
        self.line = line


def _copy_line(orig: BaseException | None) -> int | None:
    """The row a PostgreSQL error names in its ``COPY t, line N`` context, if it names one."""
    if orig is None or (sqlstate(orig) not in _ROW_SQLSTATES and (sqlstate(orig) or "")[:2] != "22"):
        return None
    context = getattr(orig, "context", None)
    if context is None:
        diag = getattr(orig, "diag", None)
        context = getattr(diag, "context", None)
    match = _COPY_LINE.match(context) if isinstance(context, str) else None
    return int(match.group(1)) if match else None


def is_refused_row(error: BaseException) -> bool:
    """Whether ``error`` refuses a row for its data: never a lost connection, a timeout or a deadlock."""
    if not isinstance(error, sa_exc.DBAPIError) or error.connection_invalidated:
        return False
    code = sqlstate(error.orig)
    if code is not None:
        return code[:2] in ("22", "23")
    number = error.orig.args[0] if error.orig is not None and error.orig.args else None
    if isinstance(number, int):  # MySQL's drivers
        return number in _MYSQL_ROW_ERRORS
    return isinstance(error, (sa_exc.IntegrityError, sa_exc.DataError))


class BulkWriter:
    """
    Writes records of one shape into a table: ``insert(table)`` with many rows, the default.

    It also sets the one savepoint that a chunk's attempts roll back to: :meth:`savepoint_async` once
    before the first attempt and again after each attempt that passed, :meth:`rollback_async` after
    each that was refused (the savepoint stays).
    """

    #: Whether the writer takes records (values in column order, processed), not ``insert()``'s parameters.
    takes_records = False

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
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: list[Any]
    ) -> None:
        """Write ``rows`` on ``connection``; :class:`Refused` if the database refuses one for its data."""
        try:
            await connection.execute(insert(table), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None

    def write_sync(self, connection: Connection, table: Table, names: Sequence[str], rows: list[Any]) -> None:
        """As :meth:`write_async`, on a sync connection."""
        try:
            connection.execute(insert(table), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None


def is_duplicate_key(error: BaseException) -> bool:
    """Whether ``error`` refuses a row for a key that a unique constraint or index already holds."""
    if not isinstance(error, sa_exc.IntegrityError) or error.orig is None:
        return False
    if error.orig.args and isinstance(error.orig.args[0], int):  # MySQL's drivers: ER_DUP_ENTRY
        return error.orig.args[0] == 1062
    code = sqlstate(error.orig)
    if code is not None:
        return code == "23505"
    return str(error.orig).startswith("UNIQUE constraint failed")  # SQLite


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

    def _statement(self, table: Table, names: Sequence[str]) -> str:
        statement = self._statements.get(tuple(names))
        if statement is None:
            preparer = self._dialect.identifier_preparer
            columns = ", ".join(preparer.quote(name) for name in names)
            values = ", ".join(self._placeholder for _ in names)
            statement = f"INSERT INTO {preparer.format_table(table)} ({columns}) VALUES ({values})"
            self._statements[tuple(names)] = statement
        return statement

    async def write_async(
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: list[Any]
    ) -> None:
        try:
            await connection.exec_driver_sql(self._statement(table, names), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None

    def write_sync(self, connection: Connection, table: Table, names: Sequence[str], rows: list[Any]) -> None:
        try:
            connection.exec_driver_sql(self._statement(table, names), rows)
        except sa_exc.DBAPIError as error:
            raise self._refused_or_raise(error) from None


class _CopyWriter(BulkWriter):
    """PostgreSQL's ``COPY ... FROM STDIN``: what every COPY writer shares."""

    takes_records = True

    def _statement(self, table: Table, names: Sequence[str]) -> str:
        preparer = self._dialect.identifier_preparer
        columns = ", ".join(preparer.quote(name) for name in names)
        return f"COPY {preparer.format_table(table)} ({columns}) FROM STDIN"

    def _wrapped(self, statement: str, error: Exception, dbapi_error: Exception | None) -> Exception:
        """The SQLAlchemy exception that ``insert()`` would raise for ``error``, the driver's."""
        if dbapi_error is None:  # refused by the driver before the server saw it: a value it cannot send
            return sa_exc.DataError(statement, None, error)
        base = self._dialect.loaded_dbapi.Error
        wrapped = sa_exc.DBAPIError.instance(statement, None, dbapi_error, base, dialect=self._dialect)
        return wrapped

    def _failed(self, statement: str, error: Exception, dbapi_error: Exception | None) -> Refused:
        wrapped = self._wrapped(statement, error, dbapi_error)
        if isinstance(wrapped, sa_exc.DBAPIError) and not isinstance(wrapped.orig, (TypeError, ValueError)):
            return self._refused_or_raise(wrapped, _copy_line(error))
        if isinstance(wrapped, sa_exc.DataError):
            return Refused(wrapped, None)
        raise wrapped


class AsyncpgCopy(_CopyWriter):
    """asyncpg's binary ``copy_records_to_table()``; the savepoint set through asyncpg, one round trip."""

    async def _execute(self, connection: AsyncConnection, statement: str) -> None:
        raw = _pooled(connection)
        try:
            await raw.driver_connection.execute(statement)
        except Exception as error:
            raise self._translated(raw, statement, error) from error

    def _translated(self, raw: Any, statement: str, error: Exception) -> Exception:
        """asyncpg's ``error`` as SQLAlchemy raises it, through SQLAlchemy's DBAPI adapter."""
        try:
            raw.dbapi_connection._handle_exception(error)
        except Exception as adapted:  # SQLAlchemy's DBAPI error for asyncpg's, as insert() gets
            return self._wrapped(statement, error, adapted)
        return error  # pragma: no cover - _handle_exception always raises

    async def savepoint_async(self, connection: AsyncConnection, *, again: bool) -> None:
        await self._execute(connection, RESET_SAVEPOINT if again else SET_SAVEPOINT)

    async def rollback_async(self, connection: AsyncConnection) -> None:
        await self._execute(connection, ROLLBACK_TO_SAVEPOINT)

    async def write_async(
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: list[Any]
    ) -> None:
        raw = _pooled(connection)
        try:
            await raw.driver_connection.copy_records_to_table(
                table.name, records=rows, columns=list(names), schema_name=table.schema
            )
        except (TypeError, ValueError, OverflowError) as error:  # a value asyncpg cannot encode
            raise self._failed(self._statement(table, names), error, None) from None
        except Exception as error:
            statement = self._statement(table, names)
            wrapped = self._translated(raw, statement, error)
            if isinstance(wrapped, sa_exc.DBAPIError) and is_refused_row(wrapped):
                raise Refused(wrapped, _copy_line(error)) from None
            raise wrapped from error


class PsycopgCopy(_CopyWriter):
    """psycopg 3's ``cursor.copy()``, sync and async, in text format; the savepoint set through psycopg."""

    async def _execute_async(self, connection: AsyncConnection, statement: str) -> None:
        driver: Any = _pooled(connection).driver_connection
        try:
            await driver.execute(statement)
        except self._dialect.loaded_dbapi.Error as error:
            raise self._wrapped(statement, error, error) from error

    def _execute_sync(self, connection: Connection, statement: str) -> None:
        driver: Any = connection.connection.driver_connection
        try:
            driver.execute(statement)
        except self._dialect.loaded_dbapi.Error as error:
            raise self._wrapped(statement, error, error) from error

    async def savepoint_async(self, connection: AsyncConnection, *, again: bool) -> None:
        await self._execute_async(connection, RESET_SAVEPOINT if again else SET_SAVEPOINT)

    async def rollback_async(self, connection: AsyncConnection) -> None:
        await self._execute_async(connection, ROLLBACK_TO_SAVEPOINT)

    def savepoint_sync(self, connection: Connection, *, again: bool) -> None:
        self._execute_sync(connection, RESET_SAVEPOINT if again else SET_SAVEPOINT)

    def rollback_sync(self, connection: Connection) -> None:
        self._execute_sync(connection, ROLLBACK_TO_SAVEPOINT)

    async def write_async(
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: list[Any]
    ) -> None:
        raw = _pooled(connection)
        driver: Any = raw.driver_connection
        statement = self._statement(table, names)
        try:
            async with driver.cursor() as cursor, cursor.copy(statement) as copy:
                for record in rows:
                    await copy.write_row(record)
        except self._dialect.loaded_dbapi.Error as error:
            raise self._failed(statement, error, error) from None
        except (TypeError, ValueError, OverflowError) as error:
            raise self._failed(statement, error, None) from None

    def write_sync(self, connection: Connection, table: Table, names: Sequence[str], rows: list[Any]) -> None:
        driver: Any = connection.connection.driver_connection
        statement = self._statement(table, names)
        try:
            with driver.cursor() as cursor, cursor.copy(statement) as copy:
                write = copy.write_row
                for record in rows:
                    write(record)
        except self._dialect.loaded_dbapi.Error as error:
            raise self._failed(statement, error, error) from None
        except (TypeError, ValueError, OverflowError) as error:
            raise self._failed(statement, error, None) from None


class Psycopg2Copy(_CopyWriter):
    """psycopg2's ``copy_expert()``, fed the text format that ``copy_text`` writes."""

    def _execute_sync(self, connection: Connection, statement: str) -> None:
        driver: Any = connection.connection.driver_connection
        try:
            with driver.cursor() as cursor:
                cursor.execute(statement)
        except self._dialect.loaded_dbapi.Error as error:
            raise self._wrapped(statement, error, error) from error

    def savepoint_sync(self, connection: Connection, *, again: bool) -> None:
        self._execute_sync(connection, RESET_SAVEPOINT if again else SET_SAVEPOINT)

    def rollback_sync(self, connection: Connection) -> None:
        self._execute_sync(connection, ROLLBACK_TO_SAVEPOINT)

    def write_sync(self, connection: Connection, table: Table, names: Sequence[str], rows: list[Any]) -> None:
        driver: Any = connection.connection.driver_connection
        statement = self._statement(table, names)
        try:
            data = io.StringIO("".join(map(text_line, rows)))
        except (TypeError, ValueError) as error:  # a value psycopg2 would not adapt: its row is refused
            raise self._failed(statement, error, None) from None
        try:
            with driver.cursor() as cursor:
                cursor.copy_expert(statement, data)
        except self._dialect.loaded_dbapi.Error as error:
            raise self._failed(statement, error, error) from None


def bulk_writer(dialect: SADialect, table: Table, needs_insert: bool) -> BulkWriter:
    """The bulk path of ``dialect``'s driver for ``table``, or ``insert()`` if the target ``needs_insert``."""
    if dialect.name == "postgresql" and not needs_insert:
        if dialect.driver == "asyncpg":
            return AsyncpgCopy(dialect)
        if dialect.driver in ("psycopg", "psycopg_async"):
            return PsycopgCopy(dialect)
        if dialect.driver == "psycopg2" and copies_as_text(table, dialect):
            return Psycopg2Copy(dialect)
    executemany = dialect.name in ("mysql", "mariadb", "sqlite") and not needs_insert
    if executemany and dialect.paramstyle in ("qmark", "format", "pyformat"):
        return ExecutemanyWriter(dialect)
    return BulkWriter(dialect)
