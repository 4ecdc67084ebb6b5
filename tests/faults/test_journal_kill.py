"""
A journalled job whose process is SIGKILLed mid-run, several times, then rerun to the end.

The job (tests/support/journal_job.py, a child process) maps ITEMS items whose units are not
idempotent: ``UPDATE jk_counters SET n = n + 1`` on the item's row and an ``INSERT INTO jk_effects``
without a natural key. The test kills it at random points (seeded: the seed is printed, and
``BOUNDEDDB_KILL_SEED`` replays it), once a random number of items committed or after a random
delay, and after each kill checks that the items done are exactly those with a journal row. A
last run, not killed, must skip exactly the items done before it and run the others, leaving every
item's effects there exactly once.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.support.journal_kill import (
    ROW_KILLS,
    TIMED_KILLS,
    Child,
    Ledger,
    check_kills_landed,
    check_last_report,
    kill_plan,
    kill_runs,
    kill_seed,
)
from tests.support.kill_targets import job_target, kill_run, let_go
from tests.support.servers import Database
from tests.support.soak import quick_or_long

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("collect_garbage")]

JOB = "tests.support.journal_job"

#: Items of the job: 1,000 in the suite, 2,000 in a soak.
ITEMS = quick_or_long(1000, 2000)
#: The kills before the last run, (once items committed, after a delay): one of each in the suite, the
#: long plan (tests/support/journal_kill.py) in a soak. The seed is random each run, printed.
KILLS = (quick_or_long(1, ROW_KILLS), quick_or_long(1, TIMED_KILLS))
#: A timed kill lands this many seconds at most after the job printed ``started``.
TIMED_KILL_S = 0.3
#: The most seconds a unit sleeps between its two statements, so that kills land inside transactions
#: (on SQLite, whose one writer at a time makes each pause the job's, less).
PAUSE_S = 0.002
SQLITE_PAUSE_S = 0.001


@dataclasses.dataclass(frozen=True)
class Case:
    server: str  # "postgresql", "mariadb", "sqlite"
    runner: str  # "semaphore", "chunked", "threads" (map_sync)
    driver: str
    batch: int = 0  # BatchPolicy(size), 0 for one transaction per unit

    @property
    def limit(self) -> int:
        return 1 if self.server == "sqlite" else 8  # SQLite takes one writer at a time

    @property
    def pause(self) -> float:
        return SQLITE_PAUSE_S if self.server == "sqlite" else PAUSE_S

    @property
    def id(self) -> str:
        return f"{self.server}-{self.runner}-{self.driver}" + (f"-batch{self.batch}" if self.batch else "")


_MARKS = {"postgresql": [pytest.mark.postgres], "mariadb": [pytest.mark.mysql], "sqlite": []}
CASES = [
    Case("postgresql", "semaphore", "asyncpg"),
    Case("postgresql", "threads", "psycopg"),
    Case("postgresql", "semaphore", "asyncpg", batch=20),
    Case("postgresql", "threads", "psycopg", batch=20),
    Case("postgresql", "chunked", "asyncpg"),
    Case("mariadb", "semaphore", "aiomysql"),
    Case("mariadb", "threads", "pymysql"),
    Case("mariadb", "semaphore", "asyncmy", batch=20),
    Case("sqlite", "threads", "pysqlite"),
    Case("sqlite", "semaphore", "aiosqlite"),
    Case("sqlite", "threads", "pysqlite", batch=20),
]


class Target(Ledger):
    """The test's database as the job and the test see it: the job's arguments, its transactions."""

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
        super().__init__(admin, db, schema=schema, items=ITEMS)
        self.case = case
        self.url = url
        self.args = args
        #: How many of the job's transactions are open now: on a server, looked up just before a
        #: kill; on SQLite, a rollback journal left behind just after it (its transaction was cut short).
        self.in_transaction = in_transaction
        self.transaction_survives_kill = transaction_survives_kill

    def arguments(self) -> list[str]:
        """The job's arguments but its items and journal."""
        case = self.case
        return [
            f"--url={self.url}",
            f"--runner={case.runner}",
            f"--batch={case.batch}",
            f"--limit={case.limit}",
            f"--pause={case.pause}",
            *self.args,
        ]


@pytest.fixture
def target(case: Case, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """The job's database for ``case``: the run's PostgreSQL schema, a MariaDB database, a SQLite file."""
    made = job_target(Target, case, request, tmp_path, "journal.sqlite3")
    made.create()
    yield made
    let_go(made, case, request)


@pytest.mark.parametrize(
    "case", [pytest.param(case, id=case.id, marks=_MARKS[case.server]) for case in CASES]
)
def test_killed_job_rerun_with_its_journal_has_each_effect_once(
    case: Case, target: Target, tmp_path: Path
) -> None:
    """Kill the job at random points (KILLS), rerun it to the end: each item's effects exactly once."""
    seed = kill_seed()
    rng = random.Random(seed)
    kills, done = kill_runs(
        rng,
        kill_plan(rng, *KILLS),
        ITEMS,
        (0, TIMED_KILL_S),
        lambda run, how, before: kill_run(JOB, target, tmp_path, run, how, before),
    )

    # The last run, to the end: it skips exactly the items done before it, and runs the others.
    report = Child(JOB, target, target.arguments(), tmp_path, len(kills)).finish()
    print(f"last run: {report}")
    check_last_report(report, done, ITEMS, f"seed {seed}, kills {kills}, last run {report}")
    target.check_all_done("after the last run")
    target.check_no_backends("after the last run")

    # The test could have failed: some kill stopped a run with some items done, and not all, and cut
    # transactions short. Where 8 units run at once, or 20 in one transaction, one always is open; one
    # unit at a time (SQLite) leaves gaps between transactions, where a kill may land.
    check_kills_landed(
        kills, ITEMS, f"{kills} (seed {seed})", in_transaction=case.limit > 1 or bool(case.batch)
    )
