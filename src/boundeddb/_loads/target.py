"""
What ``load()`` writes into: its table, the keys its rows may have, and each row turned into the
values the driver takes, as ``session.execute(insert(target), rows)`` would turn it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import repeat
from operator import countOf, itemgetter
from typing import Any, Final

from sqlalchemy import Column, Table
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.engine import processors as sa_processors
from sqlalchemy.orm import Mapper

__all__ = ["LoadTarget", "Shape", "load_target"]

#: Bind processors that return a value of this type as it is (SQLite's ``Float`` and ``Numeric``:
#: ``float(value)``): a chunk whose column holds only such values, or None, skips the processor.
_UNCHANGED: Final[dict[Any, type]] = {sa_processors.to_float: float, sa_processors.to_str: str}


class _DefaultContext:
    """What a Python column default that takes a context sees: the row's values, by column key."""

    __slots__ = ("current_parameters",)

    def __init__(self, parameters: dict[str, Any]) -> None:
        self.current_parameters = parameters

    def get_current_parameters(self, isolate_multiinsert_groups: bool = True) -> dict[str, Any]:
        return self.current_parameters


class Shape:
    """
    Rows with one set of keys, in one order: the columns they fill, and how each row's values become
    the record the bulk statement sends (Python defaults added, each type's bind processing done).
    """

    __slots__ = (
        "_by_column",
        "_defaults",
        "_fixed",
        "_processors",
        "_unchanged",
        "columns",
        "convert",
        "keys",
        "names",
    )

    def __init__(
        self, keys: tuple[str, ...], target: LoadTarget, dialect: SADialect, *, process: bool
    ) -> None:
        given = [target.columns[key] for key in keys]
        # The mapped class's polymorphic identity, for rows that do not give it: as insert(Manager) sets it.
        identity = target.identity
        fixed = [] if identity is None or any(c is identity[0] for c in given) else [identity]
        filled = {c.key for c in given} | {c.key for c, _ in fixed}
        defaulted = [column for column in target.defaulted if column.key not in filled]
        #: The input keys, in the rows' order.
        self.keys = keys
        #: The columns filled, given ones first: what a statement of this shape names.
        self.columns: list[Column[Any]] = given + [column for column, _ in fixed]
        if process:
            self.columns += defaulted
        self.names = [column.name for column in self.columns]
        self._fixed = tuple(value for _, value in fixed)
        self._defaults = [column.default for column in defaulted] if process else []
        processors: list[tuple[int, Callable[[Any], Any]]] = []
        if process:
            for position, column in enumerate(self.columns):
                processor = column.type.dialect_impl(dialect).bind_processor(dialect)
                if processor is not None:
                    processors.append((position, processor))
        self._processors = processors
        #: The processors that leave a value of one type as it is: the type, by position.
        self._unchanged = {
            position: _UNCHANGED[processor] for position, processor in processors if processor in _UNCHANGED
        }
        #: A row's values, in :attr:`keys` order, turned into what the writer takes.
        self.convert: Callable[[Sequence[Any]], Any]
        if not process:
            self.convert = self.parameters
        elif self._defaults or processors or self._fixed:
            self.convert = self.record
        else:  # the values are the record already
            self.convert = tuple
        #: Whether :meth:`convert_all` may go column by column: records to make, no default needing its row.
        self._by_column = self.convert == self.record and not any(d.is_callable for d in self._defaults)  # type: ignore[union-attr]

    def record(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """The record of a row whose values, in :attr:`keys` order, are ``values``."""
        record = [*values, *self._fixed]
        if self._defaults:
            context: _DefaultContext | None = None
            for default in self._defaults:
                assert default is not None
                if default.is_callable:  # a CallableColumnDefault, else a ScalarElementColumnDefault
                    if context is None:
                        context = _DefaultContext(
                            {c.key: v for c, v in zip(self.columns, record, strict=False)}
                        )
                    record.append(default.arg(context))  # type: ignore[attr-defined]
                else:
                    record.append(default.arg)  # type: ignore[attr-defined]
        for position, processor in self._processors:
            record[position] = processor(record[position])
        return tuple(record)

    def convert_all(self, rows: list[tuple[Any, ...]]) -> list[Any]:
        """
        :meth:`convert` of every row of ``rows``, each a tuple of values in :attr:`keys` order: column
        by column where no default needs the row, so that a type's processor runs at C speed.
        """
        if not self._by_column or not rows:
            return list(map(self.convert, rows))
        processors = self._processors
        if self._unchanged:  # a column of floats need not go through float(): the rows may be records already
            kept = {
                position
                for position, kind in self._unchanged.items()
                if position < len(self.keys)  # a given column, not a default's
                and _holds_only(partial(map, itemgetter(position), rows), len(rows), kind)
            }
            processors = [(position, processor) for position, processor in processors if position not in kept]
            if not processors and not self._fixed and not self._defaults:
                return rows
        count = len(rows)
        columns: list[Iterable[Any]] = list(zip(*rows, strict=True))
        columns += [repeat(value, count) for value in self._fixed]
        columns += [repeat(default.arg, count) for default in self._defaults]  # type: ignore[union-attr]
        for position, processor in processors:
            columns[position] = map(processor, columns[position])
        return list(zip(*columns, strict=False))

    @property
    def by_column(self) -> bool:
        """Whether a chunk of this shape may be made column by column: no default needs its row."""
        return self._by_column or self.convert is tuple

    def flat_values(self, columns: list[list[Any]], count: int) -> list[Any]:
        """
        The records of ``count`` rows given as ``columns`` (each a list of one key's values, in
        :attr:`keys` order), as :meth:`convert_all` makes them, in one list, row after row: what a
        multi-row ``INSERT`` binds. No tuple is made for a row. Only if :attr:`by_column`.
        """
        filled: list[Iterable[Any]] = [*columns]
        filled += [repeat(value, count) for value in self._fixed]
        filled += [repeat(default.arg, count) for default in self._defaults]  # type: ignore[union-attr]
        for position, processor in self._processors:
            kind = self._unchanged.get(position)
            if (
                kind is not None
                and position < len(columns)
                and _holds_only(columns[position].__iter__, count, kind)
            ):
                continue  # a given column of floats need not go through float()
            filled[position] = map(processor, filled[position])
        width = len(filled)
        values: list[Any] = [None] * (width * count)
        for position, column in enumerate(filled):  # each column into every width-th place, at C speed
            values[position::width] = column
        return values

    def parameters(self, values: Sequence[Any]) -> dict[str, Any]:
        """The row's parameters for ``insert()``, by column key: SQLAlchemy adds defaults and processes."""
        values = (*values, *self._fixed) if self._fixed else values
        return {column.key: value for column, value in zip(self.columns, values, strict=True)}


def _holds_only(values: Callable[[], Iterable[Any]], count: int, kind: type) -> bool:
    """Whether each of the ``count`` values of ``values()`` is exactly a ``kind`` (no subclass) or None."""
    if countOf(map(type, values()), kind) == count:  # no None: no set to fill
        return True
    return set(map(type, values())) <= {kind, type(None)}


class LoadTarget:
    """A mapped class or a Table that ``load()`` writes rows into."""

    def __init__(self, table: Table, columns: dict[str, Any], mapped: type | None, what: str) -> None:
        self.table = table
        #: Each key a row may have, and its column: attribute keys of a mapped class, else column keys.
        self.columns = columns
        #: The mapped class whose instances may be rows, if the target is one.
        self.mapped = mapped
        #: How messages name the target.
        self.what = what
        #: A mapped class's polymorphic identity and its column: a row without it gets it, as
        #: ``insert(Manager)`` gives it.
        self.identity: tuple[Column[Any], Any] | None = None
        #: Columns with a Python default: a row without them gets it, as ``insert()`` gives it.
        self.defaulted = [c for c in table.columns if c.default is not None and not _is_sql_default(c)]
        #: Why the bulk path cannot store this target's rows as ``insert()`` does, if it cannot.
        self.needs_insert = next(
            (
                f"the column {c.name!r} has a Python-side default that is a SQL expression or a Sequence"
                for c in table.columns
                if c.default is not None and _is_sql_default(c)
            ),
            None,
        )

    def keys_of(
        self, row: Any, columns: tuple[str, ...] | None, index: int
    ) -> tuple[tuple[str, ...], Sequence[Any]]:
        """A row's keys, and its values in their order: a mapping, a mapped instance, or a sequence."""
        if isinstance(row, Mapping):
            return tuple(row), tuple(row.values())
        if self.mapped is not None and isinstance(row, self.mapped):
            state = sa_inspect(row).dict
            keys = tuple(key for key in self.columns if key in state)
            return keys, tuple(state[key] for key in keys)
        if isinstance(row, (tuple, list)):
            if columns is None:
                msg = (
                    f"row {index} is a {type(row).__name__}, which needs columns=: pass the keys of its "
                    f'values in order, e.g. load({self.what}, rows, columns=["email", "name"])'
                )
                raise ValueError(msg)
            if len(row) != len(columns):
                msg = (
                    f"row {index} has {len(row)} values for the {len(columns)} columns= keys {list(columns)}"
                )
                raise ValueError(msg)
            return columns, row
        msg = (
            f"row {index} is {type(row).__name__}: load() takes mappings, "
            f"{'instances of the mapped class, ' if self.mapped is not None else ''}or sequences in the "
            "order of columns="
        )
        raise TypeError(msg)

    def check_keys(self, keys: tuple[str, ...], where: str) -> None:
        """Raise a ValueError naming the first of ``keys`` the target does not have, and ``where``."""
        for key in keys:
            if key not in self.columns:
                msg = (
                    f"{where} has the key {key!r}, which {self.what} does not have: its keys are "
                    f"{sorted(self.columns)}"
                )
                raise ValueError(msg)


def _is_sql_default(column: Column[Any]) -> bool:
    default = column.default
    return bool(getattr(default, "is_sequence", False) or getattr(default, "is_clause_element", False))


def load_target(target: object, columns: object) -> tuple[LoadTarget, tuple[str, ...] | None]:
    """The :class:`LoadTarget` of ``target``, and ``columns`` checked against it."""
    if isinstance(target, Table):
        loaded = LoadTarget(target, {c.key: c for c in target.columns}, None, f"the table {target.name!r}")
    else:
        mapper: object = sa_inspect(target, raiseerr=False) if isinstance(target, type) else None
        if not isinstance(mapper, Mapper):
            msg = (
                f"target must be an ORM mapped class or a sqlalchemy Table, got {target!r}: pass e.g. "
                "load(Customer, rows) or load(customers_table, rows)"
            )
            raise TypeError(msg)
        table: Any = mapper.local_table  # a Join or a subquery for some mappings
        if not isinstance(table, Table) or (
            mapper.inherits is not None and mapper.inherits.local_table is not table
        ):
            msg = (
                f"target {mapper.class_.__name__} is mapped to more than one table: load() writes one "
                "table; pass the Table of the rows, e.g. load(Manager.__table__, rows)"
            )
            raise TypeError(msg)
        keys = {
            prop.key: prop.columns[0]
            for prop in mapper.column_attrs
            if len(prop.columns) == 1 and prop.columns[0].table is table
        }
        loaded = LoadTarget(table, keys, mapper.class_, mapper.class_.__name__)
        discriminator = mapper.polymorphic_on
        if mapper.polymorphic_identity is not None and any(c is discriminator for c in keys.values()):
            loaded.identity = (discriminator, mapper.polymorphic_identity)  # type: ignore[assignment]
    if columns is None:
        return loaded, None
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
        msg = f'columns must be a list of keys, got {columns!r}: pass e.g. columns=["email", "name"]'
        raise TypeError(msg)
    names = tuple(str(name) for name in columns)
    loaded.check_keys(names, "columns=")
    if len(set(names)) != len(names):
        msg = f"columns names a key twice: {list(names)}"
        raise ValueError(msg)
    return loaded, names
