"""
A journalled ProcessRunner job SIGKILLed mid-run, several times, then rerun with its journal to the end.

The units (tests/support/journal_process_job.py) are not idempotent: ``UPDATE jpk_counters SET n =
n + 1`` on the item's row and an ``INSERT INTO jpk_effects`` without a natural key. Two ways to die:

- the parent killed: the job runs as a child process (``map_sync`` over 2 workers), which the test
  SIGKILLs at random points (seeded: the seed is printed, ``BOUNDEDDB_KILL_SEED`` replays it), its
  whole process group (the parent and its workers at once) or the parent alone (its workers must
  notice and end by themselves). A last run, not killed, must skip exactly the items done before it;
- a worker killed: in this process, SIGKILL a worker of a journalled ``map()`` several times, then
  rerun the same map with the same journal until nothing fails.

After every kill and at the end: each item done (a journal row) has its counter at 1 and one effects
row, every other item none; no process of a killed job is left, nor a backend of it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, inspect, select, text

from boundeddb import BatchPolicy, Journal, ProcessRunner, WorkerLostError
from boundeddb._processes.backends import LocalProcesses
from boundeddb.testing import PostgresServer, driver_url
from tests.support import journal_process_job as job
from tests.support.faults import wait_until
from tests.support.servers import PostgreSQL

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.usefixtures("collect_garbage"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc"),
]

ROOT = Path(__file__).resolve().parents[2]

#: Items of the in-process map, and of the child's job (each run of which starts 3 processes).
ITEMS = 1000
CHILD_ITEMS = 600
#: The most seconds a unit sleeps between its two statements: kills land inside transactions.
PAUSE_S = 0.004
#: Kills of the child before its last run: once a random number of items is done, or after a delay.
ROW_KILLS = 3
TIMED_KILLS = 1
#: Worker kills in the in-process map.
WORKER_KILLS = 3


#: What a worker may have been handed at once with limit=4 over 2 workers (protocol.most_handed of
#: its share, in batches with batch=): the most units one kill can leave failed.
def most_handed(batch: int) -> int:
    return 3 * 2 * max(1, batch)


#: A job that does nothing more for this long is taken for hung; processes that do not end in this
#: long after their parent died are taken for left behind.
STALL_S = 30.0

metadata = MetaData()
counters = Table(
    job.COUNTERS,
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("n", Integer, nullable=False),
)
#: A surrogate key only: a unit that ran twice leaves two rows for its item.
effects = Table(
    job.EFFECTS,
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("item", Integer, nullable=False),
    Column("pid", BigInteger, nullable=False),
)


@dataclasses.dataclass(frozen=True)
class Case:
    driver: str  # asyncpg: the async unit (bump); psycopg: the sync one (bump_sync)
    batch: int = 0  # BatchPolicy(size); 0 for one transaction per unit

    @property
    def id(self) -> str:
        kind = "async-asyncpg" if self.driver == "asyncpg" else "sync-psycopg"
        return kind + (f"-batch{self.batch}" if self.batch else "")


CASES = [Case("asyncpg"), Case("psycopg"), Case("asyncpg", batch=10), Case("psycopg", batch=10)]
CASE_PARAMS = [pytest.param(case, id=case.id) for case in CASES]


class Target:
    """The test's tables and journal in the run's schema, as the test reads them, and its backends."""

    def __init__(self, server: PostgresServer, schema: str, pg: PostgreSQL, items: int) -> None:
        self.server = server
        self.schema = schema
        self.pg = pg
        self.admin = pg.admin
        self.app = pg.app
        #: The counters' rows; a test may run fewer items (0 to items - 1).
        self.items = items
        self.job = f"jpk-{secrets.token_hex(3)}"
        self.journal_table = Table(
            f"jpk_journal_{secrets.token_hex(3)}",
            MetaData(),
            Column("job", String(255), primary_key=True),
            Column("item_key", String(255), primary_key=True),
        )

    def url(self, driver: str) -> str:
        return driver_url(self.server.url, driver).render_as_string(hide_password=False)  # type: ignore[arg-type]

    def journal(self) -> Journal[int]:
        return Journal(self.job, key=int, table=self.journal_table.name)

    def create(self) -> None:
        metadata.drop_all(self.admin)
        metadata.create_all(self.admin)
        with self.admin.begin() as connection:
            connection.execute(counters.insert(), [{"id": i, "n": 0} for i in range(self.items)])

    def drop(self) -> None:
        metadata.drop_all(self.admin)
        self.journal_table.drop(self.admin, checkfirst=True)

    def journal_rows(self) -> int:
        """The job's journal rows now: 0 until the job created the table."""
        table = self.journal_table
        with self.admin.connect() as connection:
            if not inspect(connection).has_table(table.name, schema=self.schema):
                return 0
            statement = select(func.count()).select_from(table).where(table.c.job == self.job)
            return int(connection.execute(statement).scalar_one())

    def state(self) -> tuple[set[int], dict[int, int], collections.Counter[int]]:
        """(items with a journal row, each counter's n, how many effects rows each item has)."""
        done: set[int] = set()
        table = self.journal_table
        with self.admin.connect() as connection:
            if inspect(connection).has_table(table.name, schema=self.schema):
                keys = connection.execute(select(table.c.item_key).where(table.c.job == self.job))
                done = {int(key) for key in keys.scalars()}
            ns = {int(i): int(n) for i, n in connection.execute(select(counters.c.id, counters.c.n))}
            rows = collections.Counter(
                int(item) for item in connection.execute(select(effects.c.item)).scalars()
            )
        return done, ns, rows

    def check_exactly_once(self, where: str) -> set[int]:
        """Every item done (a journal row) has its effects once, every other item none: the done items."""
        done, ns, rows = self.state()
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

    def check_all_done(self, where: str) -> None:
        finished = self.check_exactly_once(where)
        assert finished == set(range(self.items)), (
            f"{where}: items never done: {sorted(set(range(self.items)) - finished)[:20]}"
        )
        assert sum(self.state()[2].values()) == self.items
        assert self.journal_rows() == self.items

    def in_transaction(self) -> int:
        """How many of the job's backends are inside a transaction now."""
        statement = text(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app AND xact_start IS NOT NULL"
        )
        with self.admin.connect() as connection:
            return int(connection.execute(statement, {"app": self.app}).scalar_one())

    def wait_no_backends(self, where: str) -> None:
        """The job's connections ended on the server (open transactions rolled back), none idle in one."""
        wait_until(lambda: self.pg.connections() == 0, STALL_S, f"{where}: the job's connections to end")
        assert self.pg.open_transactions() == []


@pytest.fixture
def target(pg_server: PostgresServer, pg_schema: str, pg_db: PostgreSQL) -> Iterator[Target]:
    made = Target(pg_server, pg_schema, pg_db, ITEMS)
    made.create()
    yield made
    pg_db.terminate()  # a backend left in a transaction would block DROP
    made.drop()


def kill_seed() -> int:
    seed = int(os.environ.get("BOUNDEDDB_KILL_SEED") or random.randrange(2**32))
    print(f"BOUNDEDDB_KILL_SEED={seed}")
    return seed


# -- the processes of a child's job ----------------------------------------------------------------------


def group_members(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid`` (zombies left out): pid -> command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rpartition(")")[2].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    return found


def workers_of(members: dict[int, str]) -> list[int]:
    """The worker processes (multiprocessing's spawn) among a group's members."""
    return sorted(pid for pid, cmdline in members.items() if "spawn_main" in cmdline)


def wait_group_gone(pgid: int, where: str) -> float:
    """Until no process of the group is left; how many seconds that took. Kills what is left, then fails."""
    started = time.monotonic()
    while members := group_members(pgid):
        if time.monotonic() - started > STALL_S:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            raise AssertionError(
                f"{where}: processes of the job still running {STALL_S} s after its parent died: {members}"
            )
        time.sleep(0.02)
    return time.monotonic() - started


# -- the parent killed ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Kill:
    """One killed run: how and whom it killed, and the items done before and after it."""

    how: str
    whom: str  # "group": the parent and its workers; "parent": the parent alone
    before: int
    after: int = 0
    #: Of the job's backends at the kill, those inside a transaction (row kills only).
    in_transaction: int | None = None
    #: Worker processes alive at the kill.
    workers: int = 0
    #: Seconds until no process of the job was left.
    ended_in_s: float = 0.0


def output(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


class Child:
    """A run of the job as a child process, in a session (process group) of its own."""

    def __init__(self, target: Target, case: Case, tmp_path: Path, run: int, pause: float = PAUSE_S) -> None:
        self.out, self.err = tmp_path / f"run{run}.out", tmp_path / f"run{run}.err"
        self.run = run
        command = [
            sys.executable,
            "-m",
            "tests.support.journal_process_job",
            f"--url={target.url(case.driver)}",
            f"--items={target.items}",
            f"--job={target.job}",
            f"--table={target.journal_table.name}",
            f"--batch={case.batch}",
            f"--schema={target.schema}",
            f"--app={target.app}",
            f"--pause={pause}",
        ]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "error"}
        with self.out.open("wb") as stdout, self.err.open("wb") as stderr:
            self.process = subprocess.Popen(
                command, stdout=stdout, stderr=stderr, env=env, cwd=ROOT, start_new_session=True
            )
        #: The process group: the parent's pid (start_new_session), which its workers inherit.
        self.pgid = self.process.pid

    def outputs(self) -> str:
        return f"stdout:\n{output(self.out)}\nstderr:\n{output(self.err)}"

    def alive_or_fail(self, what: str) -> None:
        assert self.process.poll() is None, (
            f"run {self.run} ended by itself (rc {self.process.returncode}) {what}:\n{self.outputs()}"
        )

    def cleanup(self) -> None:
        """Whatever happened: nothing of the run left running."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.process.wait(STALL_S)


def kill_run(target: Target, case: Case, tmp_path: Path, run: int, how: str, whom: str, before: int) -> Kill:
    """Start the job, SIGKILL ``whom`` once ``how`` says (``rows>=N``, ``after=S``), wait till all is gone."""
    kill = Kill(how, whom, before)
    child = Child(target, case, tmp_path, run)
    try:
        if how.startswith("rows>="):
            wanted = int(how.removeprefix("rows>="))
            deadline = time.monotonic() + STALL_S
            last = before
            while (rows := target.journal_rows()) < wanted:
                child.alive_or_fail(f"at {rows} rows, before {how}")
                if rows > last:
                    last, deadline = rows, time.monotonic() + STALL_S
                assert time.monotonic() < deadline, f"run {run}: stuck at {rows} rows, waiting for {how}"
                time.sleep(0.005)
            # Freeze the job and its workers where they are: under load, the looks below take long
            # enough for a fast run to finish before the kill otherwise. Their transactions stay open.
            os.killpg(child.pgid, signal.SIGSTOP)
            kill.in_transaction = target.in_transaction()
        else:
            # A fault, not a sync point: the kill may land in the imports, the workers' start, the
            # journal table's creation, a lookup of keys, or among the units.
            seconds = float(how.removeprefix("after="))
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=seconds)
            if child.process.returncode == 0:  # it finished first: the items left were few
                assert output(child.err).strip() == "", child.outputs()
                kill.how += " (finished first)"
                kill.ended_in_s = wait_group_gone(child.pgid, f"after run {run}, which finished first")
                return finish(target, kill, f"run {run} ({how}, finished first)")
            child.alive_or_fail(f"within {seconds} s")
        kill.workers = len(workers_of(group_members(child.pgid)))
        if whom == "group":
            os.killpg(child.pgid, signal.SIGKILL)
        else:
            if how.startswith("rows>="):
                # Thawed first, and the parent killed a moment later: a stopped group whose parent
                # dies gets SIGHUP from the kernel, and its workers must end by themselves instead.
                os.killpg(child.pgid, signal.SIGCONT)
            os.kill(child.process.pid, signal.SIGKILL)
        child.process.wait(STALL_S)
        assert child.process.returncode == -signal.SIGKILL, (child.process.returncode, child.outputs())
        # The parent alone killed: its workers see their pipe close, roll back and end by themselves.
        kill.ended_in_s = wait_group_gone(child.pgid, f"after kill {run} ({how}, {whom})")
    finally:
        child.cleanup()
    return finish(target, kill, f"after kill {run} ({how}, {whom})")


def finish(target: Target, kill: Kill, where: str) -> Kill:
    """The killed run's backends are gone and its items done exactly once: how many."""
    target.wait_no_backends(where)
    kill.after = len(target.check_exactly_once(where))
    return kill


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_killed_parent_rerun_with_its_journal_has_each_effect_once(
    case: Case, target: Target, tmp_path: Path
) -> None:
    """
    SIGKILL the job's process 4 times at random points (with its workers, or alone), rerun it to
    the end: each item's effects exactly once, the last run skips exactly what was done before it.
    """
    rng = random.Random(kill_seed())
    items = target.items = CHILD_ITEMS
    plan = ["rows"] * ROW_KILLS + ["timed"] * TIMED_KILLS
    rng.shuffle(plan)
    # Among the kills once items are done (workers running): the parent alone, and its whole group.
    row_whom = ["parent", "group"] + [rng.choice(["group", "parent"]) for _ in range(ROW_KILLS - 2)]
    rng.shuffle(row_whom)
    whom = [row_whom.pop() if kind == "rows" else rng.choice(["group", "parent"]) for kind in plan]
    kills: list[Kill] = []
    done = 0
    for run, kind in enumerate(plan):
        if kind == "rows":
            how = f"rows>={done + rng.randint(1, max(1, (items - done) // 3))}"
        else:
            how = f"after={rng.uniform(0.3, 4.0):.2f}"
        kill = kill_run(target, case, tmp_path, run, how, whom[run], done)
        print(f"kill {run}: {kill}")
        assert kill.after >= done, f"kill {run}: items done went from {done} down to {kill.after}"
        kills.append(kill)
        done = kill.after

    # The last run, to the end: it skips exactly the items done before it.
    run = len(plan)
    child = Child(target, case, tmp_path, run)
    try:
        child.process.wait(timeout=120)
    finally:
        if child.process.poll() is None:
            child.cleanup()
    assert child.process.returncode == 0, (
        f"the last run failed (rc {child.process.returncode}):\n{child.outputs()}"
    )
    assert output(child.err).strip() == "", child.outputs()
    lines = child.out.read_text().splitlines()
    assert lines[0] == "started", lines
    report = json.loads(lines[-1])
    print(f"last run: {report}")
    context = f"kills {kills}, last run {report}"
    assert report["failures"] == [], context
    assert report["skipped"] == report["skipped_outcomes"] == done, context
    assert report["submitted"] == report["succeeded"] == items - done, context
    assert report["failed"] == 0, context
    assert report["outcomes"] == report["ok_outcomes"] == items, context
    assert report["indices_in_order"], context
    wait_group_gone(child.pgid, "after the last run")  # the runner closed: its workers ended
    target.wait_no_backends("after the last run")
    target.check_all_done("after the last run")

    # The test could have failed: a kill stopped a run with some items done, and not all, while
    # transactions were open, and each way of killing was tried with workers running.
    assert [k for k in kills if k.before < k.after < items], f"no kill landed mid-run: {kills}"
    assert any(k.in_transaction for k in kills), f"no kill found a transaction open: {kills}"
    killed_with_workers = {k.whom for k in kills if k.workers >= 1}
    assert killed_with_workers == {"parent", "group"}, (
        f"a way of killing never found workers running: {kills}"
    )


def test_workers_of_a_killed_parent_end_without_an_error(target: Target, tmp_path: Path) -> None:
    """SIGKILL the parent alone while both workers hold units: they end by themselves, quietly."""
    child = Child(target, Case("asyncpg"), tmp_path, 0, pause=0.1)
    try:
        # Units of 50 ms on average: each worker has units running and more handed to it.
        wait_until(lambda: target.journal_rows() >= 20, STALL_S, "20 items done")
        child.alive_or_fail("before the kill")
        assert len(workers_of(group_members(child.pgid))) == 2
        os.kill(child.process.pid, signal.SIGKILL)
        child.process.wait(STALL_S)
        wait_group_gone(child.pgid, "after the parent's kill")
    finally:
        child.cleanup()
    target.wait_no_backends("after the parent's kill")
    target.check_exactly_once("after the parent's kill")
    assert "Traceback" not in output(child.err), output(child.err)


# -- a worker killed --------------------------------------------------------------------------------------


class WorkerKiller(threading.Thread):
    """SIGKILLs a worker each time the journal reaches one of ``thresholds``: one that just committed."""

    def __init__(self, target: Target, thresholds: list[int]) -> None:
        super().__init__(name="worker-killer", daemon=True)
        self.target = target
        self.thresholds = thresholds
        self.stopped = threading.Event()
        #: (journal rows at the kill, the worker's pid)
        self.killed: list[tuple[int, int]] = []
        self.error: BaseException | None = None

    def _victim(self) -> int | None:
        """The worker that committed the latest effects row, if it is alive and was not killed yet."""
        with self.target.admin.connect() as connection:
            recent = connection.execute(select(effects.c.pid).order_by(effects.c.id.desc()).limit(20))
            for pid in recent.scalars():
                if pid != os.getpid() and pid not in {p for _, p in self.killed} and _alive(pid):
                    return int(pid)
        return None

    def run(self) -> None:
        try:
            for threshold in self.thresholds:
                while (rows := self.target.journal_rows()) < threshold or (victim := self._victim()) is None:
                    if self.stopped.wait(0.005):
                        return
                os.kill(victim, signal.SIGKILL)
                self.killed.append((rows, victim))
        except BaseException as error:  # surfaced by stop()
            self.error = error

    def stop(self) -> None:
        self.stopped.set()
        self.join(STALL_S)
        assert not self.is_alive(), "the killer thread did not stop"
        if self.error is not None:
            raise self.error


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not reaped yet, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@pytest.mark.parametrize(
    ("case", "share_marks"),
    [pytest.param(case, True, id=case.id) for case in CASES]
    + [pytest.param(Case("psycopg", batch=10), False, id="sync-psycopg-batch10-message-marks")],
)
def test_killed_workers_then_reruns_with_the_journal_have_each_effect_once(
    case: Case, share_marks: bool, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    SIGKILL a worker 3 times during a journalled map (errors="collect"): only units it had begun
    fail, with WorkerLostError; rerun the map with the same journal until nothing fails: it skips
    exactly what committed, and each item's effects are there exactly once.
    """
    monkeypatch.setattr(LocalProcesses, "share_marks", share_marks)
    rng = random.Random(kill_seed())
    items = target.items
    thresholds = [rng.randint(60, 250)]
    for _ in range(WORKER_KILLS - 1):
        thresholds.append(thresholds[-1] + rng.randint(100, 250))
    print(f"kills at journal rows {thresholds}")
    fn: Any = job.bump if case.driver == "asyncpg" else job.bump_sync
    fn = partial(fn, pause=PAUSE_S)
    journal = target.journal()
    runner = ProcessRunner(
        target.url(case.driver),
        limit=4,
        processes=2,
        errors="collect",
        engine_options=job.engine_options(case.driver, target.schema, target.app),
        batch=BatchPolicy(case.batch) if case.batch else None,
    )
    pids: set[int] = set()
    with runner:
        killer = WorkerKiller(target, thresholds)
        killer.start()
        try:
            first = runner.map_sync(fn, range(items), journal=journal)
        finally:
            killer.stop()
        killed = [pid for _, pid in killer.killed]
        print(f"killed {killer.killed}; first run {first.stats}")
        assert len(killed) == WORKER_KILLS, f"kills done: {killer.killed}, thresholds {thresholds}"
        assert [o.index for o in first.outcomes] == list(range(items))  # nothing lost
        assert first.stats.skipped == 0
        failures = first.failures
        assert 1 <= len(failures) <= WORKER_KILLS * most_handed(case.batch), [o.error for o in failures]
        assert all(isinstance(o.error, WorkerLostError) for o in failures), [o.error for o in failures]
        assert all(any(f"pid {pid})" in str(o.error) for pid in killed) for o in failures)
        done = target.check_exactly_once("after the killed run")
        assert {o.index for o in first.outcomes if o.ok} <= done
        for outcome in failures:  # in doubt: committed only if its COMMIT may have been sent
            assert outcome.index not in done or outcome.commit_unknown, outcome
        target.pg.assert_no_open_transactions("after the killed run")

        reruns: list[tuple[int, Any]] = []
        skipped_total = first.stats.skipped
        while True:
            done = target.check_exactly_once(f"before rerun {len(reruns) + 1}")
            before = len(done)
            report = runner.map_sync(fn, range(items), journal=journal)
            reruns.append((before, report.stats))
            print(f"rerun {len(reruns)}: {before} done before it, {report.stats}")
            skipped_total += report.stats.skipped
            assert [o.index for o in report.outcomes] == list(range(items))
            assert report.stats.skipped == sum(o.skipped for o in report.outcomes) == before
            assert {o.index for o in report.outcomes if o.skipped} == done
            assert report.stats.submitted == items - before
            if not report.failures:
                break
            assert len(reruns) < 3, f"still failing after {len(reruns)} reruns: {report.failures}"
        assert report.stats.succeeded == items - before
        assert runner.statistics().skipped == skipped_total
        with target.admin.connect() as connection:
            pids = set(connection.execute(select(effects.c.pid).distinct()).scalars())
    target.check_all_done("after the reruns")
    target.wait_no_backends("after the runner closed")
    assert eventually_none_alive(pids), f"worker processes left after close: {[p for p in pids if _alive(p)]}"


def eventually_none_alive(pids: set[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
