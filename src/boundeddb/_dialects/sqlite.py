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

    def cancel_statement(self, dbapi_connection: Any) -> None:
        self._call_cancel(dbapi_connection, "interrupt")


DIALECT = SQLite()
