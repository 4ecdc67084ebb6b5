"""
``load()``'s bad arguments and bad rows, each with its exact message: what is wrong, and what to pass.
An argument is refused before any database work; a bad row found in a later chunk stops the load with
the chunks before it committed, and the message says how many rows they hold.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy.orm import DeclarativeBase

from boundeddb import Journal
from tests.loads.conftest import Tables, item_rows
from tests.support.batches import BatchKit, every
from tests.support.models import Item

pytestmark = [pytest.mark.usefixtures("collect_garbage")]

#: An async runner and the thread runner: the checks are load()'s, the runner adds only its name.
KINDS = [("semaphore", "asyncio"), ("threads-psycopg", "asyncio")]


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def verb(kit: BatchKit) -> str:
    return "ThreadOffloadRunner.load" if kit.strategy == "threads" else "SemaphoreRunner.load"


class Unmapped:
    pass


class Base(DeclarativeBase):
    pass


@pytest.mark.anyio
@every(KINDS)
async def test_bad_arguments_are_refused_before_any_database_work(bkit: BatchKit, tables: Tables) -> None:
    """Target, batch, errors, columns, journal: each refused with a message that says what to pass."""
    runner = bkit.runner(limit=2)
    rows = item_rows(3)
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        (
            {"target": Unmapped},
            TypeError,
            f"target must be an ORM mapped class or a sqlalchemy Table, got {Unmapped!r}: pass e.g. "
            "load(Customer, rows) or load(customers_table, rows)",
        ),
        (
            {"batch": 0},
            ValueError,
            "batch must be at least 1, the rows per transaction, got 0: pass e.g. batch=5000",
        ),
        (
            {"batch": "10"},
            TypeError,
            "batch must be an int, the rows per transaction, got '10': pass e.g. batch=5000",
        ),
        ({"errors": "ignore"}, ValueError, 'errors must be "collect" or "raise", got \'ignore\''),
        (
            {"columns": ["key", "nope"]},
            ValueError,
            "columns= has the key 'nope', which Item does not have: its keys are ['id', 'key', 'unit']",
        ),
        ({"columns": ["key", "key"]}, ValueError, "columns names a key twice: ['key', 'key']"),
        (
            {"journal": Journal("keyed", key=lambda row: row["key"])},
            ValueError,
            f"{verb(bkit)}() names rows by their input index: pass a Journal without key=, "
            "e.g. journal=Journal('keyed')",
        ),
    ]
    for options, error, message in bad:
        call = {"target": Item, "rows": rows, **options}
        with pytest.raises(error, match=exactly(message)):
            await runner.load(call.pop("target"), call.pop("rows"), **call)
    assert tables.items() == []
    assert bkit.commits.n == 0, "nothing reached the database"


@pytest.mark.anyio
@every(KINDS)
async def test_bad_rows_in_the_first_chunk_write_nothing(bkit: BatchKit, tables: Tables) -> None:
    """Sequences without columns=, a wrong length, an unknown key, another type: refused, nothing written."""
    runner = bkit.runner(limit=2)
    bad: list[tuple[list[Any], dict[str, Any], type[Exception], str]] = [
        (
            [("k0", 0)],
            {},
            ValueError,
            "row 0 is a tuple, which needs columns=: pass the keys of its values in order, "
            'e.g. load(Item, rows, columns=["email", "name"])',
        ),
        (
            [("k0", 0), ("k1",)],
            {"columns": ["key", "unit"]},
            ValueError,
            "row 1 has 1 values for the 2 columns= keys ['key', 'unit']",
        ),
        (
            [*item_rows(3), {"key": "k3", "nope": 1}],
            {},
            ValueError,
            "row 3 has the key 'nope', which Item does not have: its keys are ['id', 'key', 'unit']",
        ),
        (  # as many keys in all as the first row's times three: one row's extra key and another's missing
            [{"key": "k0", "unit": 0}, {"key": "k1", "unit": 1, "nope": 2}, {"key": "k2"}],
            {},
            ValueError,
            "row 1 has the key 'nope', which Item does not have: its keys are ['id', 'key', 'unit']",
        ),
        (
            [{"key": "k0", "unit": 0}, 42],
            {},
            TypeError,
            "row 1 is int: load() takes mappings, instances of the mapped class, or sequences in the "
            "order of columns=",
        ),
    ]
    for rows, options, error, message in bad:
        with pytest.raises(error, match=exactly(message)):
            await runner.load(Item, rows, batch=10, **options)
    assert tables.items() == []


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "trio")])
async def test_an_unknown_key_in_a_later_chunk_keeps_the_chunks_before(
    bkit: BatchKit, tables: Tables
) -> None:
    """Row 45 has an unknown key: the load stops, and the message counts the rows committed before."""
    rows: list[Any] = item_rows(100)
    rows[45] = {"key": "k45", "unit": 45, "nope": 1}
    runner = bkit.runner(limit=1)
    with pytest.raises(ValueError, match=r"^row 45 has the key 'nope', which Item") as raised:
        await runner.load(Item, rows, batch=20)
    committed = tables.items()
    assert committed == list(range(len(committed))), "whole chunks, from the start"
    assert len(committed) in (20, 40)
    assert str(raised.value).endswith(
        f" ({len(committed)} rows of earlier chunks were committed before it was found)"
    )
    assert isinstance(raised.value.__cause__, ValueError)
    assert bkit.pool.checkedout() == 0


@pytest.mark.anyio
@every([("semaphore", "asyncio")])
async def test_map_with_a_journal_without_key_is_refused(bkit: BatchKit, tables: Tables) -> None:
    """map() names items by Journal(key=...): a load's journal, which has none, is refused."""
    runner = bkit.runner(limit=2)

    async def fn(session: Any, item: int) -> int:
        return item

    message = (
        "SemaphoreRunner.map() names each item by Journal(key=...), and this journal has none: pass e.g. "
        "Journal('load-job', key=lambda item: item.id)"
    )
    with pytest.raises(ValueError, match=exactly(message)):
        await runner.map(fn, [1, 2], journal=Journal("load-job"))
