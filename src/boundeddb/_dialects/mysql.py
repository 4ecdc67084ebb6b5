"""MySQL and MariaDB: which of their errors are worth a fresh transaction."""

from __future__ import annotations

from sqlalchemy import exc as sa_exc

from .base import Dialect

__all__ = ["DIALECT", "NAMES", "MySQL"]

NAMES = ("mysql", "mariadb")

#: MySQL/MariaDB error numbers that mean "the same transaction may well succeed if run again".
TRANSIENT_ERRNOS = frozenset(
    {
        1213,  # ER_LOCK_DEADLOCK
        1205,  # ER_LOCK_WAIT_TIMEOUT
    }
)


def errno(error: BaseException | None) -> object:
    """The error number of a MySQL driver error (its first argument), or ``None``."""
    args: tuple[object, ...] = getattr(error, "args", ())
    return args[0] if args else None


class MySQL(Dialect):
    name = "mysql"

    def is_transient(self, error: BaseException) -> bool:
        if self.is_connection_error(error):
            return True
        return isinstance(error, sa_exc.DBAPIError) and errno(error.orig) in TRANSIENT_ERRNOS


DIALECT = MySQL()
