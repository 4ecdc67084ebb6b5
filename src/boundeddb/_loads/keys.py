"""
A load's duplicate keys found before its chunk is written: once a chunk of the load has had a row
refused for a duplicate key, each next chunk asks the table which of its unique keys it holds, and
the rows that repeat one (or repeat an earlier row of the chunk) go alone after the others.

Mostly it only orders the attempts: the database still decides which row is refused, with its own
error. On PostgreSQL, a key whose constraint the server named in such a refusal decides for the rows
whose key the table holds: they are rejected unsent, with an error that reads as the server's. A key
the check misses (a unique index the metadata does not declare, a row of a chunk in flight) is found
by the search as before; a row it sets aside that the table takes is written alone.
:doc:`/explanation/loads` tells what it saves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from operator import itemgetter
from typing import Any, Final

from sqlalchemy import ARRAY, Column, Table, UniqueConstraint, any_, bindparam, select, tuple_
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.sql import Select

from .found import NAME_LIMIT, found_error, refused_by, shown
from .target import Shape

__all__ = ["KeyCheck", "KeyQuery", "plain_columns"]

#: PostgreSQL's SQLSTATE for a duplicate key: unique_violation.
UNIQUE_VIOLATION = "23505"

#: The most keys one statement asks for where they go one placeholder each (not PostgreSQL's arrays).
KEYS_PER_STATEMENT: Final = 1000


def unique_keys(table: Table, dialect: SADialect) -> list[tuple[Column[Any], ...]]:
    """
    The table's unique keys that the check can ask for: the primary key, unique constraints and
    plain unique indexes of columns whose values go to the driver and come back unprocessed.
    """
    found: list[tuple[Column[Any], ...]] = []
    candidates: list[Sequence[Any]] = [list(table.primary_key.columns)]
    for constraint in table.constraints:
        if isinstance(constraint, UniqueConstraint):
            candidates.append(list(constraint.columns))
    for index in table.indexes:
        partial = any(options.get("where") for options in index.dialect_options.values())
        if index.unique and not partial:
            candidates.append(list(index.expressions))
    for columns in candidates:
        if not columns or not all(isinstance(c, Column) and c.table is table for c in columns):
            continue
        if plain_columns(columns, dialect) and tuple(columns) not in found:
            found.append(tuple(columns))
    return found


def _server_names(table: Table) -> dict[tuple[Column[Any], ...], str]:
    """Each unique key's name on PostgreSQL: the metadata's, or the server's own for an unnamed one."""
    names: dict[tuple[Column[Any], ...], str] = {}
    for index in table.indexes:
        if index.unique and isinstance(index.name, str):
            names[tuple(index.expressions)] = index.name  # type: ignore[arg-type]
    for constraint in table.constraints:
        if isinstance(constraint, UniqueConstraint):
            given = constraint.name if isinstance(constraint.name, str) else None
            columns = tuple(constraint.columns)
            names[columns] = given or "_".join([table.name, *(c.name for c in columns), "key"])[:NAME_LIMIT]
    primary = table.primary_key
    if primary.columns:
        given = primary.name if isinstance(primary.name, str) else None
        names[tuple(primary.columns)] = given or f"{table.name}_pkey"[:NAME_LIMIT]
    return names


def plain_columns(columns: Sequence[Column[Any]], dialect: SADialect) -> bool:
    """Whether the values of ``columns`` go to the driver and come back unprocessed: a query asks for them."""
    return all(
        c.type.dialect_impl(dialect).bind_processor(dialect) is None
        and c.type.dialect_impl(dialect).result_processor(dialect, None) is None
        for c in columns
    )


class KeyQuery:
    """
    One unique key of the rows of one shape: what takes it from a record (a one-column key's value, a
    longer key's tuple) and the statement that asks the table which of some keys it holds.
    """

    __slots__ = ("array", "columns", "get", "single", "statement")

    def __init__(
        self,
        columns: tuple[Column[Any], ...],
        names: list[str],
        *,
        arrays: bool,
        local: tuple[Column[Any], ...] | None = None,
    ) -> None:
        """``local``: the record's columns that hold the key, if not ``columns`` (a foreign key's)."""
        self.columns = columns
        self.get: Callable[[Any], Any] = itemgetter(*(names.index(c.name) for c in local or columns))
        self.single = len(columns) == 1
        #: Whether the statement takes every key as one array (PostgreSQL's one-column keys), not lists.
        self.array = self.single and arrays
        keys = (
            bindparam("keys", type_=ARRAY(columns[0].type))
            if self.array
            else bindparam("keys", expanding=True)
        )
        if self.array:
            where = columns[0] == any_(keys)
        else:
            where = (columns[0] if self.single else tuple_(*columns)).in_(keys)
        self.statement: Select[Any] = select(*columns).where(where)

    def parameters(self, records: list[Any]) -> list[dict[str, Any]]:
        """The parameters of the statements that ask for the keys of ``records``: NULLs are never held."""
        keys = list(map(self.get, records))
        if not self.single or None in keys:
            keys = [key for key in keys if not _has_null(key)]
        if self.array:
            return [{"keys": keys}]
        return [
            {"keys": keys[start : start + KEYS_PER_STATEMENT]}
            for start in range(0, len(keys), KEYS_PER_STATEMENT)
        ]

    def keys_of(self, rows: Iterable[Sequence[Any]]) -> Iterable[Any]:
        """The keys in the statement's result ``rows``, as :attr:`get` takes them from a record."""
        return (row[0] for row in rows) if self.single else map(tuple, rows)


class KeyCheck:
    """
    The unique keys of a load's table and whether to check them: :attr:`armed` once a row was refused
    for a duplicate key, and until a chunk's check finds none.
    """

    def __init__(self, table: Table, dialect: SADialect) -> None:
        self._table = table
        self._keys = unique_keys(table, dialect)
        self._arrays = dialect.name == "postgresql"
        #: Whether the next chunk checks its keys.
        self.armed = False
        self._queries: dict[Shape, list[KeyQuery]] = {}
        #: PostgreSQL's name of each key; the keys whose name the server gave in a refusal.
        self._names = _server_names(table) if self._arrays else {}
        self._deciding: set[tuple[Column[Any], ...]] = set()
        #: The error of each held key met so far, by key columns and value: shared by its rows.
        self._errors: dict[tuple[tuple[Column[Any], ...], Any], Exception] = {}

    def arm(self, error: Exception) -> None:
        """Check the next chunks' keys; on PostgreSQL, let the key that ``error`` names decide."""
        self.armed = True
        name = refused_by(error, UNIQUE_VIOLATION)
        if name is not None:
            for columns in self._keys:
                if self._names.get(columns) == name:
                    self._deciding.add(columns)

    def held(self, records: list[Any], found: list[tuple[KeyQuery, Sequence[Any]]]) -> dict[int, Exception]:
        """
        The offsets of the ``records`` whose key the table holds (``found``), by a key that decides,
        each with the error the server gives for it.
        """
        refused: dict[int, Exception] = {}
        for query, rows in found:
            if query.columns not in self._deciding:
                continue
            keys_held = set(query.keys_of(rows))
            for offset, key in enumerate(map(query.get, records)):
                if offset not in refused and key in keys_held:
                    refused[offset] = self._refusal(query.columns, key)
        return refused

    def _refusal(self, columns: tuple[Column[Any], ...], key: Any) -> Exception:
        """What the server says of a row whose ``key`` of ``columns`` the table holds (one per key)."""
        made = self._errors.get((columns, key))
        if made is None:
            name = self._names[columns]
            shown_columns = ", ".join(column.name for column in columns)
            made = self._errors[columns, key] = found_error(
                f'duplicate key value violates unique constraint "{name}"',
                code=UNIQUE_VIOLATION,
                constraint=name,
                table=self._table.name,
                detail=f"Key ({shown_columns})=({shown(key)}) already exists.",
            )
        return made

    @property
    def usable(self) -> bool:
        """Whether the table has a key the check can ask for."""
        return bool(self._keys)

    def queries(self, shape: Shape) -> list[KeyQuery]:
        """The keys that rows of ``shape`` give: a key they do not give is the database's to fill."""
        queries = self._queries.get(shape)
        if queries is None:
            names = shape.names
            queries = self._queries[shape] = [
                KeyQuery(columns, names, arrays=self._arrays)
                for columns in self._keys
                if all(c.name in names for c in columns)
            ]
        return queries

    def repeated(self, records: list[Any], found: list[tuple[KeyQuery, Sequence[Any]]]) -> list[int]:
        """
        The offsets, in order, of the ``records`` whose key the table holds (``found``: each statement's
        result rows) or an earlier record has; and disarm the check if there are none.
        """
        held: dict[KeyQuery, set[Any]] = {}
        for query, rows in found:
            held.setdefault(query, set()).update(query.keys_of(rows))
        offsets: set[int] = set()
        for query, keys_held in held.items():
            keys = list(map(query.get, records))
            offsets.update(compress(range(len(keys)), map(keys_held.__contains__, keys)))
            if len(set(keys)) < len(keys):  # a key repeated in the chunk: each after its first
                seen: set[Any] = set()
                for offset, key in enumerate(keys):
                    if key in seen and not _has_null(key):
                        offsets.add(offset)
                    seen.add(key)
        if not offsets:
            self.armed = False
        return sorted(offsets)


def _has_null(key: Any) -> bool:
    """Whether a key is NULL or has a NULL: NULLs are distinct, never a duplicate."""
    return key is None or (key.__class__ is tuple and None in key)
