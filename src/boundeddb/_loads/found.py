"""
The errors of rows that ``load()`` found refused in sets on PostgreSQL (a missing parent, a key the
table holds), made to read as the server's: what names the constraint in the server's own error, and
the error a found row is rejected with. :doc:`/explanation/loads` tells when a check decides.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import exc as sa_exc

from .._dialects.postgresql import sqlstate
from .._errors import RowRefused

__all__ = ["NAME_LIMIT", "constraint_name", "found_error", "refused_by", "shown"]

#: The most characters of an identifier PostgreSQL keeps (NAMEDATALEN - 1).
NAME_LIMIT = 63


def constraint_name(orig: BaseException | None) -> str | None:
    """The constraint a PostgreSQL driver's error names: psycopg's and psycopg2's ``diag``, asyncpg's own."""
    for candidate in (orig, getattr(orig, "__cause__", None)):
        if candidate is None:
            continue
        for holder in (getattr(candidate, "diag", None), candidate):
            name = getattr(holder, "constraint_name", None)
            if isinstance(name, str):
                return name
    return None


def refused_by(error: Exception, code: str) -> str | None:
    """The constraint that ``error``, an ``IntegrityError`` of SQLSTATE ``code``, names; else None."""
    if not isinstance(error, sa_exc.IntegrityError) or error.orig is None or sqlstate(error.orig) != code:
        return None
    return constraint_name(error.orig)


def found_error(message: str, *, code: str, constraint: str, table: str, detail: str) -> Exception:
    """A found row's error: an :class:`~sqlalchemy.exc.IntegrityError` of a :class:`~boundeddb.RowRefused`."""
    orig = RowRefused(message, sqlstate=code, constraint_name=constraint, table_name=table, detail=detail)
    return sa_exc.IntegrityError(None, None, orig)


def shown(key: Any) -> str:
    """A key's value as the server's ``DETAIL`` shows it: ``9``, or ``9, x`` for a key of two columns."""
    return ", ".join(map(str, key)) if key.__class__ is tuple else str(key)
