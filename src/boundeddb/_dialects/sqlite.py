"""
The SQLite dialect, for pysqlite and aiosqlite.

A statement is stopped with the connection's ``interrupt()``.
"""

from __future__ import annotations

from typing import Any

from .base import Dialect

__all__ = ["DIALECT", "NAMES", "SQLite"]

NAMES = ("sqlite",)


class SQLite(Dialect):
    name = "sqlite"
    stops_statements = True

    def load_prepare_sql(self, driver_connection: Any) -> str | None:
        """
        ``BEGIN``, where the driver has not begun a transaction yet: sqlite3 begins one only before
        a DML statement, and a SAVEPOINT outside a transaction commits when it is released.
        """
        return None if driver_connection.in_transaction else "BEGIN"

    def cancel_statement(self, dbapi_connection: Any) -> None:
        self._call_cancel(dbapi_connection, "interrupt")


DIALECT = SQLite()
