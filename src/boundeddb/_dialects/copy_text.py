"""
PostgreSQL's ``COPY`` text format, for drivers that take a file, not records: psycopg2's ``copy_expert``.

Values are the ones psycopg2 would bind, after SQLAlchemy's bind processing; each becomes the text that
PostgreSQL's input function of its column parses, as it parses the literal psycopg2 would send.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Table, types
from sqlalchemy.engine import Dialect as SADialect

__all__ = ["copies_as_text", "text_line"]

#: Column types whose values this module writes as PostgreSQL parses them: a table with any other
#: column (a range, an IP address, a user type) is loaded with ``insert()``.
_TYPES: Final = (
    types.String,
    types.Integer,
    types.Numeric,
    types.Float,
    types.Boolean,
    types.Date,
    types.DateTime,
    types.Time,
    types.Interval,
    types.Uuid,
    types.JSON,
    types.LargeBinary,
    types.Enum,
)
#: What the text format escapes in a value: backslash first.
_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _supported(type_: Any, dialect: SADialect) -> bool:
    impl = type_.dialect_impl(dialect)
    if isinstance(impl, types.TypeDecorator):
        impl = impl.impl_instance
    if isinstance(impl, types.ARRAY):
        return _supported(impl.item_type, dialect)
    return isinstance(impl, _TYPES)


def copies_as_text(table: Table, dialect: SADialect) -> bool:
    """Whether every column of ``table`` is of a type whose values :func:`text_line` writes."""
    return all(_supported(column.type, dialect) for column in table.columns)


def _text(value: Any) -> str:
    """
    A non-NULL value as its column's input function reads it, before the format's escaping; a
    TypeError for a value psycopg2 would not adapt either, which rejects its row.
    """
    kind = value.__class__
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is bool:
        return "t" if value else "f"
    if kind is int or kind is float or kind is decimal.Decimal or kind is uuid.UUID:
        return str(value)
    # Subclasses as psycopg2 adapts them: a str or int enum member as its value, not its name.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return f"{value.days} days {value.seconds} seconds {value.microseconds} microseconds"
    if isinstance(value, (list, tuple)):
        return _array(value)
    adapted = getattr(value, "adapted", value)  # psycopg2's Binary wraps bytes
    if isinstance(adapted, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(adapted).hex()
    msg = f"can't adapt type {kind.__name__!r}"
    raise TypeError(msg)


def _array(values: Sequence[Any]) -> str:
    """A PostgreSQL array literal: ``{1,NULL,"a b"}``."""
    items = []
    for item in values:
        if item is None:
            items.append("NULL")
        elif isinstance(item, (list, tuple)):
            items.append(_array(item))
        else:
            text = _text(item).replace("\\", "\\\\").replace('"', '\\"')
            items.append(f'"{text}"')
    return "{" + ",".join(items) + "}"


def text_line(record: Sequence[Any]) -> str:
    """One row of the ``COPY`` text format: tab-separated, ``\\N`` for NULL, ending in a newline."""
    return "\t".join("\\N" if value is None else _text(value).translate(_ESCAPES) for value in record) + "\n"
