"""
A journalled ProcessRunner job SIGKILLed mid-run, several times, then rerun with its journal to the end.

The units (tests/support/journal_kill.py) are not idempotent: ``UPDATE jk_counters SET n = n + 1``
on the item's row and an ``INSERT INTO jk_effects`` without a natural key. Two ways to die:

- the parent killed: the job (tests/support/journal_process_job.py, ``map_sync`` over 2 workers) runs
  as a child process, which the test SIGKILLs at random points (seeded: the seed is printed,
  ``BOUNDEDDB_KILL_SEED`` replays it), its whole process group (the parent and its workers at once)
  or the parent alone (its workers must notice and end by themselves). A last run, not killed, must
  skip exactly the items done before it;
- a worker killed: in this process, SIGKILL a worker of a journalled ``map()`` several times, then
  rerun the same map with the same journal until nothing fails.

After every kill and at the end: each item done (a journal row) has its counter at 1 and one effects
row, every other item none; no process of a killed job is left, nor a backend of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from boundeddb import ProcessRunner, WorkerLostError
from boundeddb._processes.backends import LocalProcesses
from boundeddb.testing import PostgresServer, driver_url
from tests.support.faults import wait_until
from tests.support.journal_kill import (
    ROW_KILLS,
    STALL_S,
    TIMED_KILLS,
    Child,
    Kill,
    Ledger,
    backends_in_transaction,
    batch_policy,
    check_kills_landed,
    check_last_report,
    effects,
    engine_options,
    kill_plan,
    kill_runs,
    kill_seed,
    output,
    unit,
)
from tests.support.servers import PostgreSQL
from tests.support.soak import quick_or_long

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.usefixtures("collect_garbage"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc"),
]

JOB = "tests.support.journal_process_job"

#: Items of the in-process map, and of the child's job (each run of which starts 3 processes).
ITEMS = 1000
CHILD_ITEMS = 600
#: The most seconds a unit sleeps between its two statements: kills land inside transactions.
PAUSE_S = 0.004
#: A timed kill of the child lands this many seconds after its start, at least and at most.
TIMED_KILL_S = (0.3, 4.0)
#: Worker kills in the in-process map.
WORKER_KILLS = 3
#: The child's kills before its last run, (once items committed, after a delay): two of the first (the
#: parent alone, and its group) and one timed in the suite, the long plan in a soak.
KILLS = (quick_or_long(2, ROW_KILLS), quick_or_long(1, TIMED_KILLS))


#: What a worker may have been handed at once with limit=4 over 2 workers (protocol.most_handed of
#: its share, in batches with batch=): the most units one kill can leave failed.
def most_handed(batch: int) -> int:
    return 3 * 2 * max(1, batch)


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


class Target(Ledger):
    """The test's tables and journal in the run's schema, as the test reads them, and its backends."""

    def __init__(self, server: PostgresServer, schema: str, pg: PostgreSQL, items: int) -> None:
        super().__init__(pg.admin, pg, schema=schema, items=items)
        self.server = server
        self.pg = pg

    def url(self, driver: str) -> str:
        return driver_url(self.server.url, driver).render_as_string(hide_password=False)  # type: ignore[arg-type]

    def arguments(self, case: Case, pause: float) -> list[str]:
        """The job's arguments but its items and journal."""
        return [
            f"--url={self.url(case.driver)}",
            f"--batch={case.batch}",
            f"--schema={self.schema}",
            f"--app={self.pg.app}",
            f"--pause={pause}",
        ]

    def in_transaction(self) -> int:
        """How many of the job's backends are inside a transaction now."""
        return backends_in_transaction(self.admin, self.pg.app)


@pytest.fixture
def target(pg_server: PostgresServer, pg_schema: str, pg_db: PostgreSQL) -> Iterator[Target]:
    made = Target(pg_server, pg_schema, pg_db, ITEMS)
    made.create()
    yield made
    pg_db.terminate()  # a backend left in a transaction would block DROP
    made.drop()


def start(target: Target, case: Case, tmp_path: Path, run: int, pause: float = PAUSE_S) -> Child:
    """A run of the job as a child process, in a session (process group) of its own."""
    return Child(JOB, target, target.arguments(case, pause), tmp_path, run)


# -- the processes of a child's job ----------------------------------------------------------------------


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after "pid (comm)": state, ppid, pgrp, ...; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not reaped yet, does not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid`` (zombies left out): pid -> command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (fields := _stat(entry)) is None:
            continue
        if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
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


@dataclasses.dataclass(kw_only=True)
class ProcessKill(Kill):
    """One killed run: how and whom it killed, and the items done before and after it."""

    whom: str  # "group": the parent and its workers; "parent": the parent alone
    #: Worker processes alive at the kill.
    workers: int = 0
    #: Seconds until no process of the job was left.
    ended_in_s: float = 0.0


def kill_run(
    target: Target, case: Case, tmp_path: Path, run: int, how: str, whom: str, before: int
) -> ProcessKill:
    """Start the job, SIGKILL ``whom`` once ``how`` says (``rows>=N``, ``after=S``), wait till all is gone."""
    kill = ProcessKill(how=how, whom=whom, before=before)  # in_transaction: found at frozen kills
    child = start(target, case, tmp_path, run)
    try:
        frozen = how.startswith("rows>=")
        if frozen:
            child.freeze_at(how)
        else:
            # A fault, not a sync point: the kill may land in the imports, the workers' start, the
            # journal table's creation, a lookup of keys, or among the units. It comes at half the
            # items left at the latest: a job that finished first would leave the row kills planned
            # after this one nothing to wait for (and so untried: a killed parent, a killed group).
            deadline = time.monotonic() + float(how.removeprefix("after="))
            cap = before + max(1, (target.items - before) // 2)
            child.wait_for(
                lambda: time.monotonic() >= deadline or target.journal_rows() >= cap, how, may_end=True
            )
            if child.process.poll() == 0:  # it finished first: the items left were few
                assert output(child.err).strip() == "", child.outputs()
                kill.how += " (finished first)"
                kill.ended_in_s = wait_group_gone(child.pgid, f"after run {run}, which finished first")
                return settle(target, kill, f"run {run} ({how}, finished first)")
            if time.monotonic() < deadline:
                os.killpg(child.pgid, signal.SIGSTOP)
                kill.how += f" (came at rows>={cap})"
                frozen = True
        if frozen:
            kill.in_transaction = target.in_transaction()
        kill.workers = len(workers_of(group_members(child.pgid)))
        if whom == "group":
            os.killpg(child.pgid, signal.SIGKILL)
        else:
            if frozen:
                # Thawed first, and the parent killed a moment later: a stopped group whose parent
                # dies gets SIGHUP from the kernel, and its workers must end by themselves instead.
                os.killpg(child.pgid, signal.SIGCONT)
            os.kill(child.process.pid, signal.SIGKILL)
        child.process.wait(STALL_S)
        assert child.process.returncode == -signal.SIGKILL, (child.process.returncode, child.outputs())
        # The parent alone killed: its workers see their pipe close, roll back and end by themselves.
        kill.ended_in_s = wait_group_gone(child.pgid, f"after kill {run} ({how}, {whom})")
    finally:
        child.kill()
    return settle(target, kill, f"after kill {run} ({how}, {whom})")


def settle(target: Target, kill: ProcessKill, where: str) -> ProcessKill:
    """The killed run's backends are gone and its items done exactly once: how many."""
    target.check_no_backends(where)
    kill.after = len(target.check_exactly_once(where))
    return kill


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_killed_parent_rerun_with_its_journal_has_each_effect_once(
    case: Case, target: Target, tmp_path: Path
) -> None:
    """
    SIGKILL the job's process at random points (KILLS; with its workers, or alone), rerun it to
    the end: each item's effects exactly once, the last run skips exactly what was done before it.
    """
    rng = random.Random(kill_seed())
    items = target.items = CHILD_ITEMS
    plan = kill_plan(rng, *KILLS)
    # Among the kills once items are done (workers running): the parent alone, and its whole group.
    row_whom = ["parent", "group"] + [rng.choice(["group", "parent"]) for _ in range(KILLS[0] - 2)]
    rng.shuffle(row_whom)
    whom = [row_whom.pop() if kind == "rows" else rng.choice(["group", "parent"]) for kind in plan]
    kills, done = kill_runs(
        rng,
        plan,
        items,
        TIMED_KILL_S,
        lambda run, how, before: kill_run(target, case, tmp_path, run, how, whom[run], before),
    )

    # The last run, to the end: it skips exactly the items done before it.
    child = start(target, case, tmp_path, len(kills))
    report = child.finish()
    print(f"last run: {report}")
    context = f"kills {kills}, last run {report}"
    check_last_report(report, done, items, context)
    assert report["indices_in_order"], context
    wait_group_gone(child.pgid, "after the last run")  # the runner closed: its workers ended
    target.check_no_backends("after the last run")
    target.check_all_done("after the last run")

    # The test could have failed: a kill stopped a run with some items done, and not all, while
    # transactions were open, and each way of killing was tried with workers running.
    check_kills_landed(kills, items, str(kills))
    killed_with_workers = {k.whom for k in kills if k.workers >= 1}
    assert killed_with_workers == {"parent", "group"}, (
        f"a way of killing never found workers running: {kills}"
    )


def test_workers_of_a_killed_parent_end_without_an_error(target: Target, tmp_path: Path) -> None:
    """SIGKILL the parent alone while both workers hold units: they end by themselves, quietly."""
    child = start(target, Case("asyncpg"), tmp_path, 0, pause=0.1)
    try:
        # Units of 50 ms on average: each worker has units running and more handed to it.
        wait_until(lambda: target.journal_rows() >= 20, STALL_S, "20 items done")
        child.alive_or_fail("before the kill")
        assert len(workers_of(group_members(child.pgid))) == 2
        os.kill(child.process.pid, signal.SIGKILL)
        child.process.wait(STALL_S)
        wait_group_gone(child.pgid, "after the parent's kill")
    finally:
        child.kill()
    target.check_no_backends("after the parent's kill")
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
    url = target.url(case.driver)
    fn = unit(url, PAUSE_S)
    journal = target.journal()
    runner = ProcessRunner(
        url,
        limit=4,
        processes=2,
        errors="collect",
        engine_options=engine_options(case.driver, target.schema, target.pg.app),
        batch=batch_policy(case.batch),
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
    target.check_no_backends("after the runner closed")
    assert eventually_none_alive(pids), f"worker processes left after close: {[p for p in pids if _alive(p)]}"


def eventually_none_alive(pids: set[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
