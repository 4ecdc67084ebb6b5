"""
A load's rows that miss a parent row, found in sets: once PostgreSQL has refused a row of the load
for a foreign key, each next chunk asks the referenced table which of its references it holds, and
the rows whose parent is missing are rejected at once, with an error that reads as the server's.

Without it each such row costs a bisection of its chunk, about a millisecond a row: a load whose rows
miss a parent in one case of six ran at a tenth of a hand-written staging import (issue #55). The
check is armed only by the server's own refusal, naming a constraint the table's metadata declares
the same way: a foreign key in the metadata that the database does not have never rejects a row. A
reference the check misses (a parent deleted meanwhile, a chunk of several shapes) is found by the
search as before. :doc:`/explanation/loads` tells what it saves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import ARRAY, Column, ForeignKeyConstraint, Table, bindparam, exists, func, select
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.sql import Select

from .found import NAME_LIMIT, found_error, refused_by, shown
from .keys import KeyQuery, plain_columns
from .target import Shape

__all__ = ["MissingQuery", "ReferenceCheck"]

#: PostgreSQL's SQLSTATE for a row whose foreign key names no row: foreign_key_violation.
FOREIGN_KEY_VIOLATION = "23503"


def _server_name(constraint: ForeignKeyConstraint, table: Table) -> str:
    """The constraint's name in the database: the metadata's, or PostgreSQL's for an unnamed one."""
    if isinstance(constraint.name, str):
        return constraint.name
    return "_".join([table.name, *(column.name for column in constraint.columns), "fkey"])[:NAME_LIMIT]


class _Reference:
    """One foreign key: its local columns, the referenced table's, and the names the error gives."""

    __slots__ = ("local", "name", "referred", "referred_table")

    def __init__(self, constraint: ForeignKeyConstraint, table: Table) -> None:
        self.name = _server_name(constraint, table)
        self.local: tuple[Column[Any], ...] = tuple(constraint.columns)
        self.referred: tuple[Column[Any], ...] = tuple(element.column for element in constraint.elements)
        self.referred_table: Table = constraint.referred_table


class MissingQuery:
    """
    A one-column foreign key on PostgreSQL: which of some keys name no row, asked with every key as one
    array, so that only the missing ones come back.
    """

    __slots__ = ("get", "statement")

    def __init__(self, reference: _Reference, names: list[str]) -> None:
        self.get: Callable[[Any], Any] = itemgetter(names.index(reference.local[0].name))
        referred = reference.referred[0]
        keys = bindparam("keys", type_=ARRAY(referred.type))
        given = func.unnest(keys).table_valued("key").render_derived(name="given")
        self.statement: Select[Any] = select(given.c.key).where(~exists().where(referred == given.c.key))

    def parameters(self, records: list[Any]) -> list[dict[str, Any]]:
        """The statement's parameters for the keys of ``records``, each once: NULL names no row."""
        keys = set(map(self.get, records))
        keys.discard(None)
        return [{"keys": list(keys)}]


class ReferenceCheck:
    """
    The foreign keys of a load's table that the check can ask for, and which are armed: each once
    the server refused a row of the load for it, until a chunk's check finds no row that misses it.
    """

    def __init__(self, table: Table, dialect: SADialect) -> None:
        self._table = table
        self._arrays = dialect.name == "postgresql"
        self._references: dict[str, _Reference] = {}
        for constraint in table.foreign_key_constraints:
            reference = _Reference(constraint, table)
            if reference.referred_table is table:  # a row may name a row of its own chunk
                continue
            if plain_columns(reference.local, dialect) and plain_columns(reference.referred, dialect):
                self._references[reference.name] = reference
        #: The names of the foreign keys each next chunk checks.
        self.armed: set[str] = set()
        self._queries: dict[tuple[Shape, str], KeyQuery | MissingQuery | None] = {}
        #: The error of each missing key met so far, by foreign key and key: shared by its rows.
        self._errors: dict[tuple[str, Any], Exception] = {}

    @property
    def usable(self) -> bool:
        """Whether the table has a foreign key the check can ask for."""
        return bool(self._references)

    def arm(self, error: Exception) -> bool:
        """Arm the foreign key that ``error`` refused a row for, if the check knows it: whether it did."""
        name = refused_by(error, FOREIGN_KEY_VIOLATION)
        if name is None or name not in self._references:
            return False
        self.armed.add(name)
        return True

    def queries(self, shape: Shape) -> list[tuple[str, KeyQuery | MissingQuery]]:
        """The armed foreign keys that rows of ``shape`` give, each with what asks for its parents."""
        found = []
        for name in sorted(self.armed):
            if (shape, name) not in self._queries:
                reference = self._references[name]
                names = shape.names
                query: KeyQuery | MissingQuery | None = None
                if all(column.name in names for column in reference.local):
                    if self._arrays and len(reference.local) == 1:
                        query = MissingQuery(reference, names)
                    else:
                        local = reference.local
                        query = KeyQuery(reference.referred, names, arrays=self._arrays, local=local)
                self._queries[shape, name] = query
            asked = self._queries[shape, name]
            if asked is not None:
                found.append((name, asked))
        return found

    def missing(
        self, records: list[Any], found: list[tuple[str, KeyQuery | MissingQuery, Sequence[Any]]]
    ) -> dict[int, Exception]:
        """
        The offsets of the ``records`` whose reference names no row, by ``found`` (each armed key's
        query and its result rows), each with why; and disarm each key that no record missed.
        """
        answers: dict[str, tuple[KeyQuery | MissingQuery, bool, set[Any]]] = {}
        for name, query, rows in found:
            keys = (row[0] for row in rows) if isinstance(query, MissingQuery) else query.keys_of(rows)
            answers.setdefault(name, (query, isinstance(query, MissingQuery), set()))[2].update(keys)
        refused: dict[int, Exception] = {}
        for name, (query, missing, keys) in answers.items():
            missed = False
            for offset, key in enumerate(map(query.get, records)):
                if key is None or (key.__class__ is tuple and None in key):
                    continue  # MATCH SIMPLE: a reference with a NULL names no row and is not checked
                if (key in keys) is missing:  # among the missing keys, or not among the parents found
                    missed = True
                    if offset not in refused:
                        refused[offset] = self._refusal(self._references[name], key)
            if not missed:
                self.armed.discard(name)
        return refused

    def _refusal(self, reference: _Reference, key: Any) -> Exception:
        """
        What the server says of a row whose ``key`` names no row of ``reference``'s table: an
        :class:`~sqlalchemy.exc.IntegrityError` of a :class:`~boundeddb.RowRefused`, one for the rows of
        each such key (made once: a load's missing parents are often named again and again).
        """
        made = self._errors.get((reference.name, key))
        if made is not None:
            return made
        columns = ", ".join(column.name for column in reference.local)
        table, parent = self._table.name, reference.referred_table.name
        made = self._errors[reference.name, key] = found_error(
            f'insert or update on table "{table}" violates foreign key constraint "{reference.name}"',
            code=FOREIGN_KEY_VIOLATION,
            constraint=reference.name,
            table=table,
            detail=f'Key ({columns})=({shown(key)}) is not present in table "{parent}".',
        )
        return made
