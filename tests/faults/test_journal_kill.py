"""
A journalled job whose process is SIGKILLed mid-run, several times, then rerun to the end.

The job (tests/support/journal_job.py, a child process) maps 2,000 items whose units are not
idempotent: ``UPDATE jk_counters SET n = n + 1`` on the item's row and an ``INSERT INTO jk_effects``
without a natural key. The test kills it at random points (seeded: the seed is printed, and
``BOUNDEDDB_KILL_SEED`` replays it), once a random number of items committed or after a random
delay, and after each kill checks that the items done are exactly those with a journal row. A
last run, not killed, must skip exactly the items done before it and run the others, leaving every
item's effects there exactly once.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, inspect, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from boundeddb.testing import PostgresServer, driver_url
from tests.support.batches import SqliteFile
from tests.support.faults import wait_until
from tests.support.servers import MariaDB, PostgreSQL

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("collect_garbage")]

JOB_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "journal_job.py"

ITEMS = 2000
#: Kills before the last run: some once a random number of items committed, one after a random delay.
ROW_KILLS = 3
TIMED_KILLS = 1
#: A timed kill lands this many seconds at most after the job printed ``started``.
TIMED_KILL_S = 0.3
#: The most seconds a unit sleeps between its two statements, so that kills land inside transactions
#: (on SQLite, whose one writer at a time makes each pause the job's, less).
PAUSE_S = 0.002
SQLITE_PAUSE_S = 0.001
#: A child that commits nothing more for this long is taken for hung.
STALL_S = 30.0

metadata = MetaData()
counters = Table(
    "jk_counters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("n", Integer, nullable=False),
)
#: A surrogate key only: a unit that ran twice leaves two rows for its item.
effects = Table(
    "jk_effects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("item", Integer, nullable=False),
)


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


class Target:
    """The test's database as the job and the test see it: the child's arguments, reads, leak checks."""

    def __init__(
        self,
        case: Case,
        url: str,
        admin: Engine,
        *,
        schema: str | None,
        args: list[str],
        connections: Callable[[], int],
        open_transactions: Callable[[], list[Any]],
        in_transaction: Callable[[], int],
        transaction_survives_kill: bool = False,
    ) -> None:
        self.case = case
        self.url = url
        self.admin = admin
        self.schema = schema
        self.args = args
        #: How many connections the job has open on the server (0 for SQLite: no server).
        self.connections = connections
        self.open_transactions = open_transactions
        #: How many of the job's transactions are open now: on a server, looked up just before a
        #: kill; on SQLite, a rollback journal left behind just after it (its transaction was cut short).
        self.in_transaction = in_transaction
        self.transaction_survives_kill = transaction_survives_kill
        self.job = f"kill-{secrets.token_hex(3)}"
        self.journal = Table(
            f"jk_journal_{secrets.token_hex(3)}",
            MetaData(),
            Column("job", String(255), primary_key=True),
            Column("item_key", String(255), primary_key=True),
        )

    def create(self) -> None:
        metadata.drop_all(self.admin)
        metadata.create_all(self.admin)
        with self.admin.begin() as connection:
            connection.execute(counters.insert(), [{"id": i, "n": 0} for i in range(ITEMS)])

    def drop(self) -> None:
        metadata.drop_all(self.admin)
        self.journal.drop(self.admin, checkfirst=True)

    def journal_rows(self) -> int:
        """The job's journal rows now: 0 until the job created the table."""
        if not inspect(self.admin).has_table(self.journal.name, schema=self.schema):
            return 0
        statement = select(func.count()).select_from(self.journal).where(self.journal.c.job == self.job)
        with self.admin.connect() as connection:
            return int(connection.execute(statement).scalar_one())

    def state(self) -> tuple[set[int], dict[int, int], collections.Counter[int]]:
        """(items with a journal row, each counter's n, how many effects rows each item has)."""
        done: set[int] = set()
        with self.admin.connect() as connection:
            if inspect(connection).has_table(self.journal.name, schema=self.schema):
                keys = connection.execute(
                    select(self.journal.c.item_key).where(self.journal.c.job == self.job)
                )
                done = {int(key) for key in keys.scalars()}
            ns = {int(i): int(n) for i, n in connection.execute(select(counters.c.id, counters.c.n))}
            rows = collections.Counter(
                int(item) for item in connection.execute(select(effects.c.item)).scalars()
            )
        return done, ns, rows

    def command(self) -> list[str]:
        case = self.case
        return [
            sys.executable,
            str(JOB_SCRIPT),
            f"--url={self.url}",
            f"--runner={case.runner}",
            f"--batch={case.batch}",
            f"--items={ITEMS}",
            f"--job={self.job}",
            f"--table={self.journal.name}",
            f"--limit={case.limit}",
            f"--pause={case.pause}",
            *self.args,
        ]


@pytest.fixture
def target(case: Case, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """The job's database for ``case``: the run's PostgreSQL schema, a MariaDB database, a SQLite file."""
    made: Target
    if case.server == "postgresql":
        server: PostgresServer = request.getfixturevalue("pg_server")
        pg: PostgreSQL = request.getfixturevalue("pg_db")
        schema: str = request.getfixturevalue("pg_schema")
        url = driver_url(server.url, case.driver).render_as_string(hide_password=False)  # type: ignore[arg-type]

        def in_transaction() -> int:
            with pg.admin.connect() as connection:
                statement = text(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app "
                    "AND xact_start IS NOT NULL"
                )
                return int(connection.execute(statement, {"app": pg.app}).scalar_one())

        made = Target(
            case,
            url,
            pg.admin,
            schema=schema,
            args=[f"--schema={schema}", f"--app={pg.app}"],
            connections=pg.connections,
            open_transactions=pg.open_transactions,
            in_transaction=in_transaction,
        )
    elif case.server == "mariadb":
        mysql: MariaDB = request.getfixturevalue("mysql_db")
        made = Target(
            case,
            mysql.url(case.driver).render_as_string(hide_password=False),
            mysql.admin.execution_options(schema_translate_map={None: mysql.database}),
            schema=mysql.database,
            args=[],
            connections=mysql.connections,
            open_transactions=mysql.open_transactions,
            in_transaction=lambda: len(mysql.threads_in_transaction() & mysql.connection_ids()),
        )
    else:
        path = tmp_path / "journal.sqlite3"
        drivername = "sqlite+aiosqlite" if case.driver == "aiosqlite" else "sqlite"
        made = Target(
            case,
            f"{drivername}:///{path}",
            create_engine(f"sqlite:///{path}", poolclass=NullPool),
            schema=None,
            args=[],
            connections=lambda: 0,
            open_transactions=SqliteFile(path).open_transactions,
            in_transaction=lambda: int(path.with_name(path.name + "-journal").exists()),
            transaction_survives_kill=True,
        )
    made.create()
    yield made
    if case.server == "postgresql":  # a child's backend left in a transaction would block DROP TABLE
        request.getfixturevalue("pg_db").terminate()
    made.drop()
    if case.server == "sqlite":
        made.admin.dispose()


@dataclasses.dataclass
class Kill:
    """One killed run: how it was killed, and the items done before and after it."""

    how: str
    before: int
    after: int
    #: The job's transactions open at the kill (see Target.in_transaction).
    in_transaction: int


def check_exactly_once(target: Target, where: str) -> set[int]:
    """Every item done (journal row) has its effects once, every other item none: the done items."""
    done, ns, rows = target.state()
    twice = sorted(i for i, n in ns.items() if n > 1)
    assert twice == [], f"{where}: counters bumped more than once: {twice[:20]}"
    duplicated = sorted(i for i, n in rows.items() if n > 1)
    assert duplicated == [], f"{where}: items with more than one effects row: {duplicated[:20]}"
    bumped = {i for i, n in ns.items() if n == 1}
    assert bumped == done, (
        f"{where}: bumped without a journal row: {sorted(bumped - done)[:20]}, "
        f"journal row without a bump: {sorted(done - bumped)[:20]}"
    )
    assert set(rows) == done, (
        f"{where}: effects without a journal row: {sorted(set(rows) - done)[:20]}, "
        f"journal row without effects: {sorted(done - set(rows))[:20]}"
    )
    return done


def wait_gone(target: Target, where: str) -> None:
    """The killed job's connections ended on the server (its open transactions rolled back)."""
    wait_until(lambda: target.connections() == 0, STALL_S, f"{where}: the job's connections to end")


def output(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


class Child:
    """One run of the job in a process of its own, its output in files."""

    def __init__(self, target: Target, tmp_path: Path, run: int) -> None:
        self.target = target
        self.run = run
        self.out, self.err = tmp_path / f"run{run}.out", tmp_path / f"run{run}.err"
        env = {**os.environ, "PYTHONWARNINGS": "error"}
        with self.out.open("wb") as stdout, self.err.open("wb") as stderr:
            self.process = subprocess.Popen(target.command(), stdout=stdout, stderr=stderr, env=env)

    def started(self) -> bool:
        """Whether the job printed ``started``: its runner exists, its first lookup is next."""
        return self.out.read_bytes().startswith(b"started\n")

    def wait_for(self, condition: Callable[[], bool], what: str, *, may_end: bool = False) -> None:
        """
        Poll ``condition`` until it holds while the job runs (or the job ends well, if it ``may_end``);
        fail if the job ends otherwise, or commits nothing for STALL_S (its pace is the machine's
        business, a stall is not).
        """
        rows, stalled_at = -1, time.monotonic() + STALL_S
        while not condition():
            if self.process.poll() is not None:
                if self.process.returncode == 0 and may_end:
                    return
                pytest.fail(
                    f"run {self.run} ended (rc {self.process.returncode}) before {what}:\n"
                    f"{output(self.out)}\n{output(self.err)}"
                )
            now_rows = self.target.journal_rows()
            if now_rows != rows:
                rows, stalled_at = now_rows, time.monotonic() + STALL_S
            elif time.monotonic() > stalled_at:
                pytest.fail(f"run {self.run}: stuck at {rows} rows for {STALL_S} s, waiting for {what}")
            time.sleep(0.005)

    def finish(self) -> dict[str, Any]:
        """Wait for the job to end by itself; its report."""
        try:
            self.wait_for(lambda: False, "the end", may_end=True)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        assert self.process.returncode == 0, f"{output(self.out)}\n{output(self.err)}"
        assert output(self.err).strip() == "", output(self.err)
        lines = self.out.read_text().splitlines()
        assert lines[0] == "started", lines
        report: dict[str, Any] = json.loads(lines[-1])
        return report

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(STALL_S)


def kill_run(target: Target, tmp_path: Path, run: int, how: str, before: int) -> Kill:
    """
    Start the job and SIGKILL it once ``how`` says: ``rows>=N``, once N items committed, or
    ``after=S``, S seconds after it printed ``started`` (in its first lookups, the table's creation
    or among its first units). Then wait for its connections to end and check the items done.
    """
    child = Child(target, tmp_path, run)
    in_transaction = 0
    try:
        if how.startswith("rows>="):
            wanted = int(how.removeprefix("rows>="))
            child.wait_for(lambda: target.journal_rows() >= wanted, how)
            # Frozen where it is, its transaction open: under load, the look below takes long enough
            # for the rest of a fast run to finish before the kill otherwise.
            child.process.send_signal(signal.SIGSTOP)
        else:
            child.wait_for(child.started, "started")
            # The fault's timing, not a sync point: nothing waits for what the job did meanwhile.
            time.sleep(float(how.removeprefix("after=")))
        if not target.transaction_survives_kill:
            in_transaction = target.in_transaction()
        assert child.process.poll() is None, (
            f"run {run} ended (rc {child.process.returncode}) before the kill ({how}):\n"
            f"{output(child.out)}\n{output(child.err)}"
        )
    finally:
        child.kill()
    if target.transaction_survives_kill:
        in_transaction = target.in_transaction()
    assert child.process.returncode == -signal.SIGKILL, (child.process.returncode, output(child.err))
    wait_gone(target, f"after kill {run} ({how})")
    after = len(check_exactly_once(target, f"after kill {run} ({how})"))
    return Kill(how, before, after, in_transaction)


@pytest.mark.parametrize(
    "case", [pytest.param(case, id=case.id, marks=_MARKS[case.server]) for case in CASES]
)
def test_killed_job_rerun_with_its_journal_has_each_effect_once(
    case: Case, target: Target, tmp_path: Path
) -> None:
    """Kill the job 4 times at random points, rerun it to the end: each item's effects exactly once."""
    seed = int(os.environ.get("BOUNDEDDB_KILL_SEED") or random.randrange(2**32))
    print(f"BOUNDEDDB_KILL_SEED={seed}")
    rng = random.Random(seed)
    plan = ["rows"] * ROW_KILLS + ["timed"] * TIMED_KILLS
    rng.shuffle(plan)
    kills: list[Kill] = []
    done = 0
    for run, kind in enumerate(plan):
        if kind == "rows":
            how = f"rows>={done + rng.randint(1, max(1, (ITEMS - done) // 3))}"
        else:
            how = f"after={rng.uniform(0, TIMED_KILL_S):.3f}"
        kill = kill_run(target, tmp_path, run, how, done)
        print(f"kill {run}: {kill}")
        assert kill.after >= done, f"kill {run}: items done went from {done} down to {kill.after}"
        kills.append(kill)
        done = kill.after

    # The last run, to the end: it skips exactly the items done before it, and runs the others.
    report = Child(target, tmp_path, len(plan)).finish()
    print(f"last run: {report}")
    context = f"seed {seed}, kills {kills}, last run {report}"
    assert report["failures"] == [], context
    assert report["skipped"] == report["skipped_outcomes"] == done, context
    assert report["submitted"] == report["succeeded"] == ITEMS - done, context
    assert report["failed"] == 0, context
    assert report["outcomes"] == report["ok_outcomes"] == ITEMS, context

    finished = check_exactly_once(target, "after the last run")
    assert finished == set(range(ITEMS)), f"items never done: {sorted(set(range(ITEMS)) - finished)[:20]}"
    assert sum(target.state()[2].values()) == ITEMS
    wait_gone(target, "after the last run")
    assert target.open_transactions() == []

    # The test could have failed: some kill stopped a run with some items done, and not all.
    mid_run = [k for k in kills if k.before < k.after < ITEMS]
    assert mid_run, f"no kill landed mid-run: {kills} (seed {seed})"
    # And cut transactions short. Where 8 units run at once, or 20 in one transaction, one always is
    # open; one unit at a time (SQLite) leaves gaps between transactions, where a kill may land.
    if case.limit > 1 or case.batch:
        assert any(k.in_transaction for k in kills), (
            f"no kill found a transaction open: {kills} (seed {seed})"
        )
