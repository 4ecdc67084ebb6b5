"""
Which bulk writer ``load()`` gets on each driver: ``COPY`` on PostgreSQL's drivers, multi-row
``INSERT`` statements on SQLite, the driver's ``executemany()`` on MySQL and MariaDB, and
``insert(table)`` with many rows everywhere else and for a target whose Python defaults only an
``INSERT`` can compute. :doc:`/explanation/loads` has the measurements behind the choice.
"""

from __future__ import annotations

from sqlalchemy import Table
from sqlalchemy.engine import Dialect as SADialect

from .bulk import BulkWriter, ExecutemanyWriter
from .bulk_copy import AsyncpgCopy, Psycopg2Copy, PsycopgCopy
from .bulk_sqlite import SqliteValuesWriter
from .copy_text import copies_as_text

__all__ = ["bulk_writer"]


def bulk_writer(dialect: SADialect, table: Table, needs_insert: bool) -> BulkWriter:
    """The bulk path of ``dialect``'s driver for ``table``, or ``insert()`` if the target ``needs_insert``."""
    if dialect.name == "postgresql" and not needs_insert:
        if dialect.driver == "asyncpg":
            return AsyncpgCopy(dialect)
        if dialect.driver in ("psycopg", "psycopg_async"):
            return PsycopgCopy(dialect)
        if dialect.driver == "psycopg2" and copies_as_text(table, dialect):
            return Psycopg2Copy(dialect)
    if dialect.name == "sqlite" and dialect.paramstyle == "qmark" and not needs_insert:
        return SqliteValuesWriter(dialect)
    executemany = dialect.name in ("mysql", "mariadb") and not needs_insert
    if executemany and dialect.paramstyle in ("qmark", "format", "pyformat"):  # qmark: MariaDB Connector
        return ExecutemanyWriter(dialect)
    return BulkWriter(dialect)
