"""
Rows found refused in sets on PostgreSQL: once the server refuses a row of a load for a foreign key, or
for a key the table holds, each next chunk asks the referenced table for its parents, or the table for
its keys, and rejects the rows that miss a parent, or repeat a held key, at once, each with an error
that reads as the server's. The refused statements grow with the chunks, not with the refused rows;
every other row is loaded once. On each PostgreSQL driver.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc

from boundeddb import RowRefused
from boundeddb._core import rejects
from tests.loads.conftest import Tables
from tests.loads.test_load_rejects import POSTGRES_CASES, TAKEN_EMAIL, code_of, person, seed_taken
from tests.support.batches import BatchKit, every

pytestmark = [pytest.mark.usefixtures("collect_garbage")]

ROWS = 3000
BATCH = 500


@pytest.fixture
def refused_statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many statements the database refused, over every chunk's search (a spy, not a stand-in)."""
    seen: list[int] = []
    real = rejects.RowSearch.refused

    def refused(self: rejects.RowSearch, *args: Any) -> None:
        seen.append(1)
        real(self, *args)

    monkeypatch.setattr(rejects.RowSearch, "refused", refused)
    return seen


def _server_says(tables: Tables, row: dict[str, Any]) -> list[str]:
    """The first two lines of what the server answers to an ``INSERT`` of ``row`` alone."""
    with tables.kit.admin().connect() as connection, pytest.raises(sa_exc.IntegrityError) as raised:
        connection.execute(tables.people.insert(), row)
    return str(raised.value.orig).splitlines()[:2]


@pytest.mark.anyio
@every(POSTGRES_CASES)
async def test_rows_that_miss_a_parent_are_rejected_in_sets_with_the_servers_words(
    bkit: BatchKit, tables: Tables, refused_statements: list[int]
) -> None:
    """One row in five misses its parent (two foreign keys, one deferred): each rejected, in sets."""
    seed_taken(tables)
    rng = random.Random(55)
    missing = set(rng.sample(range(ROWS), ROWS // 5))
    deferred = set(rng.sample(sorted(missing), 40))  # some miss both: the first key checked names them
    rows = [dict(person(i), dref=None) for i in range(ROWS)]  # one shape: a chunk of several is not checked
    for i in missing:
        rows[i]["ref"] = 1000 + i % 97
    for i in deferred:
        rows[i]["dref"] = 5000 + i
    report = await bkit.runner(limit=2).load(tables.people, rows, batch=BATCH)

    assert [rejected.index for rejected in report.rejected] == sorted(missing)
    assert (report.loaded, report.transactions) == (ROWS - len(missing), ROWS // BATCH)
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(ROWS) if i not in missing)]
    # Each chunk: at most one refused statement (the first that meets a missing parent), then the check.
    assert len(refused_statements) <= ROWS // BATCH, f"{len(refused_statements)} refused statements"
    found = [rejected for rejected in report.rejected if isinstance(rejected.error.orig, RowRefused)]
    assert len(found) >= len(missing) - 2 * BATCH, "after the first refusals, the check finds them"
    for rejected in report.rejected:
        assert isinstance(rejected.error, sa_exc.IntegrityError), rejected.error
        assert code_of(rejected.error) == "23503", rejected.error
    one = found[0]
    orig = one.error.orig
    assert isinstance(orig, RowRefused)
    assert orig.constraint_name == orig.diag.constraint_name == "load_people_ref_fkey"
    assert orig.sqlstate == orig.pgcode == "23503"
    assert one.error.__traceback__ is None
    bad = dict(rows[one.index], n=ROWS + 1, email="alone@example.com")
    assert str(orig).splitlines() == _server_says(tables, bad)


@pytest.mark.anyio
@every([("semaphore", "asyncio")])
async def test_a_foreign_key_named_otherwise_in_the_database_is_found_by_the_search(
    bkit: BatchKit, tables: Tables, refused_statements: list[int]
) -> None:
    """The metadata's name is not the server's: the check never arms, and the search still finds each row."""
    seed_taken(tables)
    with tables.kit.admin().begin() as connection:
        connection.execute(
            text("ALTER TABLE load_people RENAME CONSTRAINT load_people_ref_fkey TO other_name")
        )
    missing = set(random.Random(7).sample(range(400), 20))
    rows = [dict(person(i), ref=999) if i in missing else person(i) for i in range(400)]
    report = await bkit.runner(limit=1).load(tables.people, rows, batch=100)
    assert [rejected.index for rejected in report.rejected] == sorted(missing)
    assert not any(isinstance(rejected.error.orig, RowRefused) for rejected in report.rejected)
    assert len(refused_statements) > len(missing), "found by bisection, statement by statement"


def test_a_row_refused_pickles_with_what_the_server_said() -> None:
    """A rejected row's error crosses to a ProcessRunner's parent whole."""
    error = RowRefused(
        'insert or update on table "t" violates foreign key constraint "t_p_fkey"',
        sqlstate="23503",
        constraint_name="t_p_fkey",
        table_name="t",
        detail='Key (p)=(9) is not present in table "p".',
    )
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.sqlstate, copy.constraint_name, copy.table_name, copy.detail) == (
        str(error),
        "23503",
        "t_p_fkey",
        "t",
        'Key (p)=(9) is not present in table "p".',
    )


@pytest.mark.anyio
@every([("threads-psycopg", "asyncio")])
async def test_a_check_that_fails_is_not_asked_again_and_the_search_finds_the_rows(
    bkit: BatchKit, tables: Tables, refused_statements: list[int]
) -> None:
    """The referenced table is not where the metadata says: the check fails once, the search does the rest."""
    seed_taken(tables)
    with tables.kit.admin().begin() as connection:  # the foreign key follows the table; the metadata does not
        connection.execute(text("ALTER TABLE load_refs RENAME TO load_refs_moved"))
    try:
        missing = set(random.Random(8).sample(range(400), 20))
        rows = [dict(person(i), ref=999) if i in missing else person(i) for i in range(400)]
        checks: list[str] = []
        runner = bkit.runner(limit=1)
        engine = bkit.engine

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "unnest" in statement:
                checks.append(statement)

        event.listen(engine, "before_cursor_execute", before)
        try:
            report = await runner.load(tables.people, rows, batch=100)
        finally:
            event.remove(engine, "before_cursor_execute", before)
    finally:
        with tables.kit.admin().begin() as connection:
            connection.execute(text("ALTER TABLE load_refs_moved RENAME TO load_refs"))
    assert [rejected.index for rejected in report.rejected] == sorted(missing)
    assert not any(isinstance(rejected.error.orig, RowRefused) for rejected in report.rejected)
    assert (report.loaded, report.transactions) == (380, 4)
    assert len(checks) == 1, "the check failed once and was not asked again"
    assert len(refused_statements) > len(missing), "found by the search"
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(400) if i not in missing)]


@pytest.mark.anyio
@every(POSTGRES_CASES)
async def test_rows_whose_key_the_table_holds_are_rejected_in_sets_with_the_servers_words(
    bkit: BatchKit, tables: Tables, refused_statements: list[int]
) -> None:
    """1% of the rows repeat a key the table holds: rejected unsent after the first refusal; repeats alone."""
    seed_taken(tables)
    rng = random.Random(505)
    taken = set(rng.sample(range(ROWS), ROWS // 100))
    repeats = {  # within one chunk: across chunks in flight, which row commits first is the race's
        i: i - 1 for i in rng.sample(range(1, ROWS), 10) if i % BATCH and not {i, i - 1} & taken
    }
    rows = [person(i) for i in range(ROWS)]
    for i in taken:
        rows[i]["email"] = TAKEN_EMAIL
    for i, first in repeats.items():
        rows[i]["email"] = rows[first]["email"]  # a key repeated in the input: the server decides, alone
    report = await bkit.runner(limit=2).load(tables.people, rows, batch=BATCH)

    bad = taken | set(repeats)
    assert [rejected.index for rejected in report.rejected] == sorted(bad)
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(ROWS) if i not in bad)]
    found = [rejected for rejected in report.rejected if isinstance(rejected.error.orig, RowRefused)]
    assert {rejected.index for rejected in found} <= taken, "a repeat within the input is the server's"
    assert len(found) >= len(taken) - 2 * BATCH // 100, "after the first refusals, the check finds them"
    # Each chunk: at most one refused statement before its check, then one for each repeat, alone.
    assert len(refused_statements) <= ROWS // BATCH + len(repeats), f"{len(refused_statements)} refused"
    assert all(code_of(rejected.error) == "23505" for rejected in report.rejected)
    orig = found[0].error.orig
    assert orig.constraint_name == "load_people_email_key"
    bad_row = dict(rows[found[0].index], n=ROWS + 1)
    assert str(orig).splitlines() == _server_says(tables, bad_row)
