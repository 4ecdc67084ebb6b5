"""
Which of a driver's errors refuse a row for its data, and which row a bulk statement's error names:
what ``load()`` rejects a row for, where any other error stops its chunk.
"""

from __future__ import annotations

import re
from typing import Final

from sqlalchemy import exc as sa_exc

from .postgresql import sqlstate

__all__ = ["Refused", "copy_line", "is_duplicate_key", "is_refused_row"]

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


class Refused(Exception):
    """A bulk statement's rows were refused for their data: ``error`` says why, ``line`` which row from 1."""

    def __init__(self, error: Exception, line: int | None) -> None:
        super().__init__(error, line)
        self.error = error
        self.line = line


def copy_line(orig: BaseException | None) -> int | None:
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
