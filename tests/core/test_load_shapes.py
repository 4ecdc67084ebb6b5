"""How ``load()`` turns a chunk's rows into records: column by column gives what row by row gives."""

from __future__ import annotations

from itertools import chain

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, create_engine

from boundeddb._dialects.bulk import FlatRows
from boundeddb._loads.target import Shape, load_target

TABLE = Table(
    "shapes",
    MetaData(),
    Column("a", Integer),
    Column("f", Float),
    Column("s", String(10), default="scalar"),
    Column("c", String(10), default=lambda context: f"row {context.get_current_parameters()['a']}"),
)
DIALECT = create_engine("sqlite://").dialect


def shape(keys: tuple[str, ...]) -> Shape:
    target, _ = load_target(TABLE, None)
    return Shape(keys, target, DIALECT, process=True)


def test_a_chunk_converted_column_by_column_equals_its_rows_converted_one_by_one() -> None:
    """Processors and a scalar default, column by column: the records row by row would make."""
    made = shape(("a", "f", "c"))
    assert made._by_column, "no default reads the row: the chunk goes column by column"
    rows = [(1, 2), (3, 4.5), (5, None)]
    rows = [(a, f, f"given {a}") for a, f in rows]
    assert made.convert_all(rows) == [made.record(row) for row in rows]
    assert made.convert_all(rows) == [
        (1, 2.0, "given 1", "scalar"),
        (3, 4.5, "given 3", "scalar"),
        (5, None, "given 5", "scalar"),
    ]


def test_a_default_that_reads_its_row_is_made_row_by_row() -> None:
    """A callable default sees each row's own values, in a chunk too."""
    made = shape(("a",))
    assert not made._by_column
    assert made.convert_all([(1,), (2,)]) == [(1, "scalar", "row 1"), (2, "scalar", "row 2")]


class Fraction(float):
    """A float subclass, as numpy's float64 is: SQLite's Float processor makes it a plain float."""


def test_a_column_of_floats_skips_float_and_the_rows_are_the_records() -> None:
    """SQLite's ``Float`` processor is ``float()``: a chunk of floats (or None) is sent as given."""
    made = shape(("a", "f", "s", "c"))
    for rows in ([(1, 2.5, "x", "y"), (2, None, "x", "y")], [(1, 2.5, "x", "y"), (2, 0.5, "x", "y")]):
        assert made.convert_all(rows) is rows
        assert made.convert_all(rows) == [made.record(row) for row in rows]


def test_a_column_not_all_floats_goes_through_float() -> None:
    """An int or a float subclass among the floats: every value is processed, as insert() would."""
    made = shape(("a", "f", "s", "c"))
    for odd in (3, Fraction(3.5), True):
        rows = [(1, 2.5, "x", "y"), (2, odd, "x", "y")]
        records = made.convert_all(rows)
        assert records == [made.record(row) for row in rows]
        assert type(records[1][1]) is float, odd


def test_a_chunk_made_flat_holds_the_values_of_the_records_column_by_column_makes() -> None:
    """What SQLite's multi-row INSERT binds: the records of convert_all, one after another, no tuple a row."""
    made = shape(("a", "f", "c"))
    assert made.by_column
    for floats in ([2.5, 4.5, None], [2, Fraction(3.5), True], [0.5, 1.5, 2.5]):
        rows = [(a, f, f"given {a}") for a, f in zip((1, 3, 5), floats, strict=True)]
        columns = [list(column) for column in zip(*rows, strict=True)]
        values = made.flat_values(columns, len(rows))
        assert values == list(chain.from_iterable(made.convert_all(rows)))
        assert [type(value) for value in values[1::4]] == [
            type(record[1]) for record in made.convert_all(rows)
        ]
    assert not shape(("a",)).by_column, "a default that reads its row: the chunk is made row by row"


def test_flat_rows_are_a_sequence_of_their_records() -> None:
    """FlatRows: len, indexes and slices as the list of records, and the rows of spans."""
    records = [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    flat = FlatRows(list(chain.from_iterable(records)), 2)
    assert len(flat) == 4
    assert flat.records() == records
    assert [flat[0], flat[-1], flat[1:3], list(flat)] == [records[0], records[-1], records[1:3], records]
    assert flat.spans(((0, 4),)) is flat
    assert flat.spans(((0, 1), (2, 4))).records() == [records[0], *records[2:]]
    assert flat.spans(((1, 2),)).values == [2, "b"]


def test_a_float_column_filled_by_its_default_is_processed_not_looked_for_in_the_rows() -> None:
    """A Float column the rows leave to its scalar default: none holds it, none is checked (an IndexError)."""
    table = Table("defaulted", MetaData(), Column("a", Integer), Column("f", Float, default=1))
    target, _ = load_target(table, None)
    made = Shape(("a",), target, DIALECT, process=True)
    rows = [(1,), (2,)]
    assert made.convert_all(rows) == [made.record(row) for row in rows] == [(1, 1.0), (2, 1.0)]
    values = made.flat_values([[1, 2]], 2)
    assert values == [1, 1.0, 2, 1.0]
    assert [type(value) for value in values] == [int, float, int, float]
