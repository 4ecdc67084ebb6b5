"""
PostgreSQL's ``COPY ... FROM STDIN`` for ``load()``: asyncpg's ``copy_records_to_table()`` (binary),
psycopg 3's ``cursor.copy()`` (text), sync and async, psycopg2's ``copy_expert()`` (text, for tables
of the column types ``copy_text`` writes). A refused row's line is read from the error's context.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from .bulk import RESET_SAVEPOINT, ROLLBACK_TO_SAVEPOINT, SET_SAVEPOINT, BulkWriter, pooled
from .copy_text import text_line
from .refusals import Refused, copy_line, is_refused_row

__all__ = ["AsyncpgCopy", "Psycopg2Copy", "PsycopgCopy"]


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
            return self._refused_or_raise(wrapped, copy_line(error))
        if isinstance(wrapped, sa_exc.DataError):
            return Refused(wrapped, None)
        raise wrapped


class AsyncpgCopy(_CopyWriter):
    """asyncpg's binary ``copy_records_to_table()``; the savepoint set through asyncpg, one round trip."""

    async def _execute(self, connection: AsyncConnection, statement: str) -> None:
        raw = pooled(connection)
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
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        raw = pooled(connection)
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
                raise Refused(wrapped, copy_line(error)) from None
            raise wrapped from error


class PsycopgCopy(_CopyWriter):
    """psycopg 3's ``cursor.copy()``, sync and async, in text format; the savepoint set through psycopg."""

    async def _execute_async(self, connection: AsyncConnection, statement: str) -> None:
        driver: Any = pooled(connection).driver_connection
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
        self, connection: AsyncConnection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
        raw = pooled(connection)
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

    def write_sync(
        self, connection: Connection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
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

    def write_sync(
        self, connection: Connection, table: Table, names: Sequence[str], rows: Sequence[Any]
    ) -> None:
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
