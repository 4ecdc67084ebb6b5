"""
A journalled ``load()`` whose process is SIGKILLed at random points, then rerun: each row loaded exactly once.

The job (tests/support/load_job.py, a child process) loads ROWS rows with ``Journal(job)``, a chunk of
BATCH rows per transaction, some of them rows the database refuses (a repeated primary key, a NULL or
negative value). The test kills it at random points (seeded: the seed is printed, and
``BOUNDEDDB_KILL_SEED`` replays it), once a random number of rows committed or after a random delay,
and after each kill checks that the rows in the table are exactly those the journal's ``rows:A-B``
keys name, each once: a chunk's rows and its journal rows commit together. A last run, not killed,
must skip exactly the rows loaded before it, load the others, reject every refused row and leave
every good row there exactly once. In the ``unkeyed`` variant the table has no key at all, so a row
loaded twice would be there twice.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, func, inspect, select
from sqlalchemy.engine import Engine

from tests.support import load_job
from tests.support.journal_kill import (
    ROW_KILLS,
    TIMED_KILLS,
    Child,
    Ledger,
    check_kills_landed,
    kill_plan,
    kill_runs,
    kill_seed,
)
from tests.support.kill_targets import job_target, kill_run, let_go
from tests.support.servers import Database
from tests.support.soak import quick_or_long, soaking

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("collect_garbage")]

JOB = "tests.support.load_job"

#: Rows of the job's input: 1,200 in the suite, 3,000 in a soak; one in REFUSE_EVERY is refused.
ROWS = quick_or_long(1200, 3000)
#: Rows per chunk, so per transaction.
BATCH = 40
#: The kills before the last run, (once rows committed, after a delay): one of each in the suite, the
#: long plan (tests/support/journal_kill.py) in a soak. The seed is random each run, printed.
KILLS = (quick_or_long(1, ROW_KILLS), quick_or_long(1, TIMED_KILLS))
#: A timed kill lands this many seconds at most after the job printed ``started``: in the suite, mostly
#: in the load's first lookups or first chunk; in a soak, among its chunks too.
TIMED_KILL_S = quick_or_long(150, 400) / 1000
#: The least milliseconds a whole load takes, its chunks' pauses around their journal INSERTs summed: a
#: timed kill must find the job still running after the row kill before it loaded up to a third of the
#: rows (a soak's three, up to 19/27), and a chunk or so more.
LEAST_LOAD_MS = quick_or_long(500, 3000)

GOOD = [index for index in range(ROWS) if not load_job.refused(index)]
REFUSED = [index for index in range(ROWS) if load_job.refused(index)]


@dataclasses.dataclass(frozen=True)
class Case:
    server: str  # "postgresql", "mariadb", "sqlite"
    runner: str  # "semaphore", "chunked", "threads" (load_sync)
    driver: str
    variant: str  # "keyed" (refused: a repeated primary key), "unkeyed" (no key; refused: NULL, CHECK)

    @property
    def limit(self) -> int:
        return 1 if self.server == "sqlite" else 4  # SQLite takes one writer at a time

    @property
    def pause(self) -> float:
        """
        The most seconds a chunk sleeps around its journal INSERT (it sleeps half of that at least): an
        async job's sleeps block its event loop, so add up; a threaded job's overlap, ``limit`` at once.
        """
        overlap = self.limit if self.runner == "threads" else 1
        return round(2 * LEAST_LOAD_MS / 1000 * overlap / math.ceil(ROWS / BATCH), 4)

    @property
    def id(self) -> str:
        return f"{self.server}-{self.runner}-{self.driver}-{self.variant}"


_MARKS = {"postgresql": [pytest.mark.postgres], "mariadb": [pytest.mark.mysql], "sqlite": []}
CASES = [
    Case("postgresql", "semaphore", "asyncpg", "unkeyed"),
    Case("postgresql", "threads", "psycopg", "keyed"),
    Case("mariadb", "semaphore", "aiomysql", "unkeyed"),
    Case("sqlite", "threads", "pysqlite", "unkeyed"),
]
#: A soak runs the other runners, drivers and variants too.
SOAK_CASES = [
    Case("postgresql", "chunked", "asyncpg", "keyed"),
    Case("postgresql", "threads", "psycopg", "unkeyed"),
    Case("mariadb", "threads", "pymysql", "keyed"),
    Case("sqlite", "semaphore", "aiosqlite", "keyed"),
]


def parse_key(key: str | bytes) -> tuple[int, int]:
    """A load's journal key ``rows:START-STOP`` (bytes on MariaDB): (START, STOP); anything else fails."""
    text = key.decode() if isinstance(key, bytes) else key
    prefix, _, run = text.partition(":")
    start, _, stop = run.partition("-")
    assert prefix == "rows", f"not a load's journal key: {key!r}"
    assert start.isdigit(), f"not a load's journal key: {key!r}"
    assert stop.isdigit(), f"not a load's journal key: {key!r}"
    assert int(start) < int(stop), f"an empty run: {key!r}"
    return int(start), int(stop)


class Target(Ledger):
    """The job's table and journal as the test reads them, the job's arguments, its transactions."""

    def __init__(
        self,
        case: Case,
        url: str,
        admin: Engine,
        db: Database,
        *,
        schema: str | None,
        args: list[str],
        in_transaction: Callable[[], int],
        transaction_survives_kill: bool = False,
    ) -> None:
        super().__init__(admin, db, schema=schema, items=len(GOOD))
        self.case = case
        self.url = url
        self.args = args
        self.table = load_job.TABLES[case.variant]
        #: ``Journal(job)``'s table: the default one, in the test's own schema or database.
        self.journal_table = Table(
            "boundeddb_journal", MetaData(), Column("job", String(255)), Column("item_key", String(255))
        )
        #: As in tests/faults/test_journal_kill.py: on a server looked up just before a kill; on
        #: SQLite, a rollback journal left behind just after it.
        self.in_transaction = in_transaction
        self.transaction_survives_kill = transaction_survives_kill

    def job_arguments(self) -> list[str]:
        return [f"--rows={ROWS}", f"--job={self.job}", f"--variant={self.case.variant}"]

    def arguments(self) -> list[str]:
        case = self.case
        return [
            f"--url={self.url}",
            f"--runner={case.runner}",
            f"--batch={BATCH}",
            f"--limit={case.limit}",
            f"--pause={case.pause}",
            *self.args,
        ]

    def create(self) -> None:
        self.table.drop(self.admin, checkfirst=True)
        self.table.create(self.admin)
        if self.case.variant == "keyed":
            with self.admin.begin() as connection:
                connection.execute(self.table.insert(), load_job.taken_rows())

    def drop(self) -> None:
        self.table.drop(self.admin, checkfirst=True)
        self.journal_table.drop(self.admin, checkfirst=True)

    def runs(self) -> list[tuple[int, int]]:
        """The index runs the job's journal names, sorted: none until the job created the table."""
        table = self.journal_table
        with self.admin.connect() as connection:
            if not inspect(connection).has_table(table.name, schema=self.schema):
                return []
            keys = connection.execute(select(table.c.item_key).where(table.c.job == self.job)).scalars()
            return sorted(parse_key(key) for key in keys)

    def journal_rows(self) -> int:
        """The rows the journal says committed (how the test paces its kills)."""
        return sum(stop - start for start, stop in self.runs())

    def check_exactly_once(self, where: str) -> set[int]:
        """
        The journal's runs are disjoint and name no refused row, and the table's rows of the input are
        exactly the rows they name, each once and as given: the rows loaded.
        """
        runs = self.runs()
        for (_, stop), (start, _) in itertools.pairwise(runs):
            assert stop <= start, f"{where}: the journal names a row twice: {runs}"
        done = {index for start, stop in runs for index in range(start, stop)}
        assert done <= set(range(ROWS)), f"{where}: the journal names rows past the input: {runs}"
        assert not done & set(REFUSED), (
            f"{where}: the journal names refused rows {sorted(done & set(REFUSED))}"
        )
        table = self.table
        with self.admin.connect() as connection:
            loaded = connection.execute(
                select(table.c.idx, table.c.id, table.c.value, table.c.note).where(table.c.idx >= 0)
            ).all()
            taken = connection.execute(select(func.count()).select_from(table).where(table.c.idx < 0))
            taken_now = int(taken.scalar_one())
        counts = collections.Counter(int(idx) for idx, *_ in loaded)
        twice = sorted(idx for idx, n in counts.items() if n > 1)
        assert twice == [], f"{where}: rows loaded more than once: {twice[:20]}"
        assert set(counts) == done, (
            f"{where}: rows in the table without a journal run: {sorted(set(counts) - done)[:20]}, "
            f"journal runs' rows not in the table: {sorted(done - set(counts))[:20]}"
        )
        variant = self.case.variant
        wrong = [tuple(r) for r in loaded if dict(r._mapping) != load_job.row(variant, int(r.idx))]
        assert wrong == [], f"{where}: rows not as given: {wrong[:5]}"
        expected_taken = len(load_job.TAKEN_IDS) if self.case.variant == "keyed" else 0
        assert taken_now == expected_taken, f"{where}: {taken_now} rows not of the input"
        return done

    def check_all_done(self, where: str) -> None:
        """:meth:`check_exactly_once`, and every good row is loaded."""
        done = self.check_exactly_once(where)
        assert done == set(GOOD), f"{where}: good rows never loaded: {sorted(set(GOOD) - done)[:20]}"


@pytest.fixture
def target(case: Case, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """The job's database for ``case``: the run's PostgreSQL schema, a MariaDB database, a SQLite file."""
    made = job_target(Target, case, request, tmp_path, "load.sqlite3")
    made.create()
    yield made
    let_go(made, case, request)


def check_last_report(report: dict[str, Any], done: int, context: str) -> None:
    """The last run skipped the ``done`` rows, loaded the other good ones, rejected every refused one."""
    assert report["failed"] == 0, context
    assert report["skipped"] == done, context
    assert report["loaded"] == len(GOOD) - done, context
    assert report["rejected"] == REFUSED, context
    assert report["transactions"] == math.ceil((ROWS - done) / BATCH), context


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, id=case.id, marks=_MARKS[case.server])
        for case in CASES + (SOAK_CASES if soaking() else [])
    ],
)
def test_killed_load_rerun_with_its_journal_loads_each_row_once(
    case: Case, target: Target, tmp_path: Path
) -> None:
    """Kill the load at random points (KILLS), rerun it to the end: each good row loaded exactly once."""
    seed = kill_seed()
    print(f"case {case.id}: rows {ROWS}, batch {BATCH}, pause {case.pause}")
    rng = random.Random(seed)
    kills, done = kill_runs(
        rng,
        kill_plan(rng, *KILLS),
        len(GOOD),
        (0, TIMED_KILL_S),
        lambda run, how, before: kill_run(JOB, target, tmp_path, run, how, before),
    )

    # The last run, to the end: it skips exactly the rows loaded before it, and loads the others.
    report = Child(JOB, target, target.arguments(), tmp_path, len(kills)).finish()
    print(f"last run: {report}")
    check_last_report(report, done, f"seed {seed}, kills {kills}, last run {report}")
    target.check_all_done("after the last run")
    target.check_no_backends("after the last run")

    # The test could have failed: some kill stopped a run with some rows loaded, and not all, and cut
    # a chunk's transaction short (its rows written, its journal rows not yet committed).
    check_kills_landed(kills, len(GOOD), f"{kills} (seed {seed})")
