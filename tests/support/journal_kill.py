"""
What the journal kill tests and the jobs they SIGKILL share: tables and units, the job's side, the test's.

tests/faults/test_journal_kill.py runs tests/support/journal_job.py (one runner) and
tests/faults/test_journal_process_kill.py runs tests/support/journal_process_job.py (a ProcessRunner) as
child processes, ``python -m tests.support.<job>`` from the repository's root (:class:`Child`); those
import this module too, and so do a ProcessRunner's workers, for the units. So at import it needs no
more of the test suite, nor pytest: a failed check raises AssertionError.

The units are not idempotent: ``UPDATE jk_counters SET n = n + 1`` on the item's row and an ``INSERT
INTO jk_effects`` without a natural key. A job prints ``started`` once its runner exists, and as its
last line a JSON object (:func:`summary`): the run's stats and its failures.
"""

from __future__ import annotations

import argparse
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
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, inspect, select, text
from sqlalchemy.engine import URL, Engine, make_url

from boundeddb import BatchPolicy, Journal, RunReport

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    from tests.support.servers import Database

ROOT = Path(__file__).resolve().parents[2]

#: A job that commits nothing more for this long is taken for hung (and its processes, that do not end
#: in this long after their parent died, for left behind).
STALL_S = 30.0
#: Kills before the last run in a soak (``nox -s soak``): some once a random number of items committed,
#: one after a random delay. The suite's tests choose fewer (see their ``KILLS``).
ROW_KILLS = 3
TIMED_KILLS = 1

# -- the tables and the units ------------------------------------------------------------------------------

metadata = MetaData()
counters = Table(
    "jk_counters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("n", Integer, nullable=False),
)
#: A surrogate key only: a unit that ran twice leaves two rows for its item; ``pid``, the process it ran in.
effects = Table(
    "jk_effects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("item", Integer, nullable=False),
    Column("pid", BigInteger, nullable=False),
)

BUMP = text(f"UPDATE {counters.name} SET n = n + 1 WHERE id = :item")
EFFECT = text(f"INSERT INTO {effects.name} (item, pid) VALUES (:item, :pid)")


async def bump(session: AsyncSession, item: int, pause: float = 0.0) -> int:
    """Bump the item's counter, sleep up to ``pause`` seconds (random), add its effects row."""
    await session.execute(BUMP, {"item": item})
    if pause:
        await anyio.sleep(random.uniform(0, pause))
    await session.execute(EFFECT, {"item": item, "pid": os.getpid()})
    return item


def bump_sync(session: Session, item: int, pause: float = 0.0) -> int:
    """As :func:`bump`, for a sync driver, in a thread."""
    session.execute(BUMP, {"item": item})
    if pause:
        time.sleep(random.uniform(0, pause))
    session.execute(EFFECT, {"item": item, "pid": os.getpid()})
    return item


def unit(url: str | URL, pause: float) -> Any:
    """The unit for ``url``'s driver, with ``pause``: :func:`bump` if it is async, else :func:`bump_sync`."""
    fn: Any = bump if make_url(url).get_dialect().is_async else bump_sync
    return partial(fn, pause=pause) if pause else fn


def journal(job: str, table: str) -> Journal[int]:
    """The job's journal: its items are the ints 0 to items - 1."""
    return Journal(job, key=int, table=table)


def batch_policy(size: int) -> BatchPolicy | None:
    """``BatchPolicy(size)``; None for 0, one transaction per unit."""
    return BatchPolicy(size) if size else None


# -- the job's side ----------------------------------------------------------------------------------------


def job_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments every job takes (each adds its own): the database, the journal, the units' pace."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", required=True, help="a SQLAlchemy URL: an async driver runs bump, a sync one bump_sync"
    )
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--table", default="boundeddb_journal", help="the journal's table")
    parser.add_argument("--batch", type=int, default=0, help="BatchPolicy(size); 0: one transaction per unit")
    parser.add_argument("--schema", help="PostgreSQL: the search_path")
    parser.add_argument("--app", help="PostgreSQL: the application_name")
    parser.add_argument("--pause", type=float, default=0.0, help="the most seconds a unit sleeps (random)")
    return parser


def engine_options(driver: str, schema: str | None, app: str | None) -> dict[str, Any]:
    """For PostgreSQL, the schema and application_name as the suite's fixtures set them; nothing elsewhere."""
    if driver == "asyncpg":
        settings = {"search_path": schema, "application_name": app}
        return {"connect_args": {"server_settings": {k: v for k, v in settings.items() if v}}}
    if driver in ("psycopg", "psycopg2"):
        connect_args: dict[str, Any] = {}
        if schema:
            connect_args["options"] = f"-c search_path={schema}"
        if app:
            connect_args["application_name"] = app
        return {"connect_args": connect_args}
    return {}


def say_started() -> None:
    """Tell the test the runner exists: its first lookup is next."""
    print("started", flush=True)


def summary(report: RunReport[Any]) -> dict[str, Any]:
    """What the test reads of a run's report."""
    stats = report.stats
    outcomes = report.outcomes
    return {
        "submitted": stats.submitted,
        "elapsed_s": round(stats.elapsed_s, 2),
        "succeeded": stats.succeeded,
        "failed": stats.failed,
        "skipped": stats.skipped,
        "commit_unknown": sum(o.commit_unknown for o in outcomes),
        "outcomes": len(outcomes),
        "indices_in_order": [o.index for o in outcomes] == list(range(len(outcomes))),
        "skipped_outcomes": sum(o.skipped for o in outcomes),
        "ok_outcomes": sum(o.ok for o in outcomes),
        "failures": [
            f"item {o.index} after {o.attempts} attempt(s): {type(o.error).__name__}: {o.error}"[:300]
            for o in outcomes
            if o.error is not None
        ][:20],
    }


def say_report(report: RunReport[Any]) -> None:
    """Print the run's :func:`summary`, the job's last line."""
    print(json.dumps(summary(report)), flush=True)


# -- the test's side ---------------------------------------------------------------------------------------


class Ledger:
    """A job's tables as the test reads them: the counters, the effects, its journal; and its connections."""

    def __init__(self, admin: Engine, db: Database, *, schema: str | None, items: int) -> None:
        self.admin = admin
        #: The server's view of the job's connections (none for SQLite).
        self.db = db
        self.schema = schema
        #: The counters' rows; a test may run fewer items (0 to items - 1).
        self.items = items
        self.job = f"jk-{secrets.token_hex(3)}"
        self.journal_table = Table(
            f"jk_journal_{secrets.token_hex(3)}",
            MetaData(),
            Column("job", String(255), primary_key=True),
            Column("item_key", String(255), primary_key=True),
        )

    def journal(self) -> Journal[int]:
        return journal(self.job, self.journal_table.name)

    def job_arguments(self) -> list[str]:
        """The job's arguments for its items and its journal."""
        return [f"--items={self.items}", f"--job={self.job}", f"--table={self.journal_table.name}"]

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
        """:meth:`check_exactly_once`, and every item is done."""
        finished = self.check_exactly_once(where)
        assert finished == set(range(self.items)), (
            f"{where}: items never done: {sorted(set(range(self.items)) - finished)[:20]}"
        )
        assert sum(self.state()[2].values()) == self.items
        assert self.journal_rows() == self.items

    def wait_gone(self, where: str) -> None:
        """Until the job's connections ended on the server (its open transactions rolled back)."""
        from tests.support.faults import wait_until  # not at the top: it imports pytest, which jobs need not

        wait_until(lambda: self.db.connections() == 0, STALL_S, f"{where}: the job's connections to end")

    def check_no_backends(self, where: str) -> None:
        """:meth:`wait_gone`, and nothing of the job idle in a transaction."""
        self.wait_gone(where)
        assert (open_now := self.db.open_transactions()) == [], f"{where}: left in a transaction: {open_now}"


def backends_in_transaction(admin: Engine, app: str) -> int:
    """How many PostgreSQL backends of ``app`` are inside a transaction now."""
    statement = text(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app AND xact_start IS NOT NULL"
    )
    with admin.connect() as connection:
        return int(connection.execute(statement, {"app": app}).scalar_one())


def output(path: Path) -> str:
    """The end of a job's output file."""
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


class Child:
    """One run of a job (``python -m module``) in a process group of its own, its output in files."""

    def __init__(self, module: str, ledger: Ledger, arguments: list[str], tmp_path: Path, run: int) -> None:
        self.ledger = ledger
        self.run = run
        self.out, self.err = tmp_path / f"run{run}.out", tmp_path / f"run{run}.err"
        command = [sys.executable, "-m", module, *ledger.job_arguments(), *arguments]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "error"}
        with self.out.open("wb") as stdout, self.err.open("wb") as stderr:
            self.process = subprocess.Popen(
                command, stdout=stdout, stderr=stderr, env=env, cwd=ROOT, start_new_session=True
            )
        #: The process group: the job's pid (start_new_session), which its workers inherit.
        self.pgid = self.process.pid

    def outputs(self) -> str:
        return f"stdout:\n{output(self.out)}\nstderr:\n{output(self.err)}"

    def started(self) -> bool:
        """Whether the job printed ``started``: its runner exists, its first lookup is next."""
        return self.out.read_bytes().startswith(b"started\n")

    def alive_or_fail(self, what: str) -> None:
        assert self.process.poll() is None, (
            f"run {self.run} ended by itself (rc {self.process.returncode}) {what}:\n{self.outputs()}"
        )

    def wait_for(self, condition: Callable[[], bool], what: str, *, may_end: bool = False) -> None:
        """
        Poll ``condition`` until it holds while the job runs (or the job ends well, if it ``may_end``);
        fail if the job ends otherwise, or commits nothing for STALL_S (its pace is the machine's
        business, a stall is not).
        """
        rows, stalled_at = -1, time.monotonic() + STALL_S
        while not condition():
            if may_end and self.process.poll() == 0:
                return
            self.alive_or_fail(f"before {what}")
            now_rows = self.ledger.journal_rows()
            if now_rows != rows:
                rows, stalled_at = now_rows, time.monotonic() + STALL_S
            elif time.monotonic() > stalled_at:
                raise AssertionError(
                    f"run {self.run}: stuck at {rows} rows for {STALL_S} s, waiting for {what}"
                )
            time.sleep(0.005)

    def freeze_at(self, how: str) -> None:
        """
        Once the job's journal has the rows ``how`` says (``rows>=N``), SIGSTOP its group where it is, its
        transactions open: under load, the looks before the kill take long enough for the rest of a fast
        run to finish otherwise.
        """
        wanted = int(how.removeprefix("rows>="))
        self.wait_for(lambda: self.ledger.journal_rows() >= wanted, how)
        os.killpg(self.pgid, signal.SIGSTOP)

    def finish(self) -> dict[str, Any]:
        """Wait for the job to end by itself, well and quietly; its report."""
        try:
            self.wait_for(lambda: False, "the end", may_end=True)
        finally:
            if self.process.poll() is None:
                self.kill()
        assert self.process.returncode == 0, (
            f"the last run failed (rc {self.process.returncode}):\n{self.outputs()}"
        )
        assert output(self.err).strip() == "", self.outputs()
        lines = self.out.read_text().splitlines()
        assert lines[0] == "started", lines
        report: dict[str, Any] = json.loads(lines[-1])
        return report

    def kill(self) -> None:
        """SIGKILL whatever is left of the job's group, and wait for the job to be gone."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.process.wait(STALL_S)


@dataclasses.dataclass(kw_only=True)
class Kill:
    """One killed run: how it was killed, and the items done before and after it."""

    how: str
    before: int
    after: int = 0
    #: The job's transactions open at the kill.
    in_transaction: int | None = None


KillT = TypeVar("KillT", bound=Kill)


def kill_seed() -> int:
    """A random seed, printed, or ``BOUNDEDDB_KILL_SEED``'s, to replay one."""
    seed = int(os.environ.get("BOUNDEDDB_KILL_SEED") or random.randrange(2**32))
    print(f"BOUNDEDDB_KILL_SEED={seed}")
    return seed


def kill_plan(rng: random.Random, rows: int = ROW_KILLS, timed: int = TIMED_KILLS) -> list[str]:
    """The kinds of the kills before the last run, shuffled: ``rows`` ``"rows"``, ``timed`` ``"timed"``."""
    plan = ["rows"] * rows + ["timed"] * timed
    rng.shuffle(plan)
    return plan


def kill_runs(
    rng: random.Random,
    plan: list[str],
    items: int,
    timed_s: tuple[float, float],
    kill_run: Callable[[int, str, int], KillT],
) -> tuple[list[KillT], int]:
    """
    Run the job once for each kind in ``plan``, killed by ``kill_run(run, how, items done before it)``
    once ``how`` says: ``rows>=N`` (N a random number of the items left after those done) or ``after=S``
    (S seconds, random within ``timed_s``). The kills, and the items done after the last.
    """
    kills: list[KillT] = []
    done = 0
    for run, kind in enumerate(plan):
        if kind == "rows":
            how = f"rows>={done + rng.randint(1, max(1, (items - done) // 3))}"
        else:
            how = f"after={rng.uniform(*timed_s):.3f}"
        kill = kill_run(run, how, done)
        print(f"kill {run}: {kill}")
        assert kill.after >= done, f"kill {run}: items done went from {done} down to {kill.after}"
        kills.append(kill)
        done = kill.after
    return kills, done


def check_last_report(report: dict[str, Any], done: int, items: int, context: str) -> None:
    """The last run skipped exactly the ``done`` items, ran the others, and each succeeded."""
    assert report["failures"] == [], context
    assert report["skipped"] == report["skipped_outcomes"] == done, context
    assert report["submitted"] == report["succeeded"] == items - done, context
    assert report["failed"] == 0, context
    assert report["outcomes"] == report["ok_outcomes"] == items, context


def check_kills_landed(
    kills: Sequence[Kill], items: int, context: str, *, in_transaction: bool = True
) -> None:
    """
    The test could have failed: a kill stopped a run with some items done, and not all, and (where
    ``in_transaction``) one found a transaction open.
    """
    assert [k for k in kills if k.before < k.after < items], f"no kill landed mid-run: {context}"
    if in_transaction:
        assert any(k.in_transaction for k in kills), f"no kill found a transaction open: {context}"
