"""Fault injectors and checks for tests/faults/: a backend killer, a private server, invariants."""

from __future__ import annotations

import collections
import importlib.util
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
from sqlalchemy import ForeignKey, Table, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from boundeddb import Outcome, is_transient
from tests.support.models import Item

#: The runner kinds of the fault tests that need not run on every kind: one async, one thread runner.
SMALL_CASES = [("semaphore", "asyncio"), ("threads-psycopg", "asyncio")]
SMALL_IDS = [f"{kind}-{backend}" for kind, backend in SMALL_CASES]


class FaultBase(DeclarativeBase):
    """Tables of the fault tests only, so that the shared ``items`` fixture never touches them."""


class Account(FaultBase):
    """An account for the transfer() example; ``version`` is the optimistic-locking counter."""

    __tablename__ = "fault_accounts"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    balance: Mapped[int]
    version: Mapped[int] = mapped_column()
    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012 -- SQLAlchemy's own spelling


class Parent(FaultBase):
    """A row with a lazy one-to-many relationship, for the "returned ORM object" misuse."""

    __tablename__ = "fault_parents"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    children: Mapped[list[Child]] = relationship(lazy="select")


class Child(FaultBase):
    __tablename__ = "fault_children"
    id: Mapped[int] = mapped_column(primary_key=True)
    parent_id: Mapped[int] = mapped_column(ForeignKey("fault_parents.id"))


def fault_tables(*names: str) -> list[Table]:
    """The named tables of FaultBase."""
    return [FaultBase.metadata.tables[name] for name in names]


class InsufficientFunds(Exception):
    """The payer cannot pay: a business failure, rolled back and never retried."""


# -- progress, from any thread ---------------------------------------------------------------------------


class Progress:
    """A thread-safe counter that other threads can wait on (``wait_for(n)``)."""

    def __init__(self) -> None:
        self.value = 0
        self._condition = threading.Condition()

    def add(self) -> None:
        with self._condition:
            self.value += 1
            self._condition.notify_all()

    def wait_for(self, n: int, timeout: float) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: self.value >= n, timeout)


#: A run none of whose units settles for this long is taken for hung. How long the whole run takes
#: is the machine's business: a deadline for all of it (90 s for 5,000 inserts under kills) failed
#: beside busy processes while the run went on.
STALL_S = 30.0


def deadline_per_unit(scope: anyio.CancelScope) -> Callable[[Outcome[Any]], None]:
    """An ``on_outcome`` hook that puts ``scope``'s deadline STALL_S after each unit that settles."""

    def settled(outcome: Outcome[Any]) -> None:
        scope.deadline = anyio.current_time() + STALL_S

    return settled


def inserting(is_async: bool, i: int, progress: Progress) -> Any:
    """A unit that inserts row ``i`` (its unique key) and counts the attempt once it reached the server."""
    if is_async:

        async def unit(session: AsyncSession) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            await session.flush()
            progress.add()
            return i

        return unit

    def sync_unit(session: Session) -> int:
        session.add(Item(key=f"k{i}", unit=i))
        session.flush()
        progress.add()
        return i

    return sync_unit


class Countdown:
    """Sets an anyio Event once ``n`` units have called ``arrive()`` (from the loop or a worker thread)."""

    def __init__(self, n: int, *, from_thread: bool) -> None:
        self.n = n
        self.from_thread = from_thread
        self.count = 0
        self._lock = threading.Lock()
        self.event = anyio.Event()

    def arrive(self) -> None:
        with self._lock:
            self.count += 1
            reached = self.count == self.n
        if reached:
            if self.from_thread:
                anyio.from_thread.run_sync(self.event.set)
            else:
                self.event.set()


# -- the backend killer ----------------------------------------------------------------------------------


class Killer:
    """
    Terminates random backends of one application_name, from its own connection, in a thread.

    It starts once ``progress`` reaches ``start_at`` and stops at ``stop_at`` (or when stopped),
    so the kills land in the middle of a run, and kills again each time ``progress`` has gone on by
    about ``every`` (0.5 to 1.5 times, at random). Paced by the run's progress, not by the clock: a
    busy machine, whose units take longer, sees as many kills per unit as an idle one.
    """

    def __init__(
        self,
        admin: Engine,
        app: str,
        progress: Progress,
        *,
        start_at: int,
        stop_at: int,
        every: int = 5,
        seed: int = 0,
    ) -> None:
        self._admin = admin
        self._app = app
        self._progress = progress
        self._start_at = start_at
        self._stop_at = stop_at
        self._every = every
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="killer", daemon=True)
        self.terminated = 0
        #: Of those, the backends that were running a COMMIT as they were picked (pg_stat_activity).
        self.in_commit = 0
        self.rounds = 0
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            deadline = time.monotonic() + 60
            while not self._progress.wait_for(self._start_at, 0.1):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
            # One backend at a time, sometimes all of them: kills in every phase of a unit.
            committing = "state = 'active' AND query ILIKE 'commit%'"
            one = text(
                f"SELECT count(*) FILTER (WHERE killed), count(*) FILTER (WHERE killed AND committing) "
                f"FROM (SELECT pg_terminate_backend(pid) AS killed, {committing} AS committing FROM ("
                "SELECT pid, state, query FROM pg_stat_activity WHERE application_name = :app "
                "AND backend_type = 'client backend' ORDER BY random() LIMIT 1) AS victims) AS kills"
            )
            every = text(
                f"SELECT count(*) FILTER (WHERE killed), count(*) FILTER (WHERE killed AND committing) "
                f"FROM (SELECT pg_terminate_backend(pid) AS killed, {committing} AS committing "
                "FROM pg_stat_activity WHERE application_name = :app "
                "AND backend_type = 'client backend') AS kills"
            )
            with self._admin.connect() as connection:
                while not self._stop.is_set() and self._progress.value < self._stop_at:
                    query = every if self._rng.random() < 0.1 else one
                    killed, in_commit = connection.execute(query, {"app": self._app}).one()
                    self.terminated += int(killed)
                    self.in_commit += int(in_commit)
                    self.rounds += 1
                    self._wait_for_progress(round(self._every * self._rng.uniform(0.5, 1.5)))
        except BaseException as error:  # pragma: no cover - surfaced by stop()
            self.error = error

    def _wait_for_progress(self, step: int) -> None:
        """Wait until ``progress`` has gone on by ``step`` (or the killer is stopped)."""
        target = self._progress.value + max(1, step)
        while not self._stop.is_set() and not self._progress.wait_for(target, 0.05):
            pass

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the killer thread did not stop"
        if self.error is not None:
            raise self.error


# -- checks ----------------------------------------------------------------------------------------------


def check_commit_invariant(outcomes: Sequence[Outcome[Any]], rows: Iterable[int], n: int) -> None:
    """
    The promise of a run whose every unit inserts one row with its own unique key.

    Every unit has an outcome; every row belongs to a committed or a commit_unknown unit;
    every committed unit has exactly its row; a unit that failed without ``commit_unknown``
    left no row; no row is there twice.
    """
    indices = [outcome.index for outcome in outcomes]
    assert indices == list(range(n)), f"not one outcome per unit: {len(indices)} outcomes for {n} units"
    counts = collections.Counter(rows)
    duplicates = sorted(unit for unit, count in counts.items() if count > 1)
    assert duplicates == [], f"units committed twice: {duplicates[:20]}"
    committed = {o.index for o in outcomes if o.ok}
    unknown = {o.index for o in outcomes if o.commit_unknown}
    failed = {o.index for o in outcomes if not o.ok and not o.commit_unknown}
    assert committed.isdisjoint(unknown), "a unit both committed and commit_unknown"
    strays = sorted(set(counts) - committed - unknown)
    assert strays == [], f"rows of units that neither committed nor are commit_unknown: {strays[:20]}"
    missing = sorted(committed - set(counts))
    assert missing == [], f"units reported committed have no row: {missing[:20]}"
    failed_with_rows = sorted(failed.intersection(counts))
    assert failed_with_rows == [], (
        f"units failed (not commit_unknown) yet have a row: {failed_with_rows[:20]}"
    )
    assert all(o.error is not None for o in outcomes if o.commit_unknown), "commit_unknown without an error"


def unexpected_failures(
    outcomes: Sequence[Outcome[Any]], *, also: Callable[[Exception], bool] = lambda error: False
) -> list[str]:
    """Failures other than ``commit_unknown`` or a transient error (or ``also``) whose retries ran out."""
    return [
        f"unit {o.index} after {o.attempts} attempt(s): {type(o.error).__qualname__}: {o.error}"
        for o in outcomes
        if o.error is not None and not o.commit_unknown and not is_transient(o.error) and not also(o.error)
    ]


def is_refused(error: BaseException) -> bool:
    """
    A new connection the server refused (it was down): what the drivers raise for that.

    asyncpg raises the OSError itself (``FileNotFoundError`` for a unix socket whose file is gone,
    ``ConnectionRefusedError`` over TCP); libpq (psycopg, psycopg2) an ``OperationalError``
    without a SQLSTATE, which SQLAlchemy wraps without setting ``connection_invalidated``.
    """
    if isinstance(error, OSError):
        return True
    return (
        isinstance(error, sa_exc.OperationalError)
        and codes_of(error) is None
        and any(
            phrase in str(error.orig)
            for phrase in ("No such file or directory", "Connection refused", "connection failed")
        )
    )


class ConnectAttempts(Progress):
    """Counts the engine's attempts to open a DBAPI connection (``do_connect``), failed ones too."""

    def __init__(self, engine: Engine | AsyncEngine) -> None:
        super().__init__()
        sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
        event.listen(sync_engine, "do_connect", self._on_connect)

    def _on_connect(self, *_: Any) -> None:
        self.add()


def codes_of(error: BaseException | None) -> str | None:
    """The SQLSTATE of a DBAPIError, whichever driver raised it (psycopg, psycopg2, asyncpg), or None."""
    orig = getattr(error, "orig", None)
    for candidate in (orig, getattr(orig, "__cause__", None)):
        for attribute in ("sqlstate", "pgcode"):
            code = getattr(candidate, attribute, None)
            if isinstance(code, str):
                return code
    return None


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` (server state) until it holds; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def active_queries(admin: Engine, app: str, like: str) -> int:
    """Backends of ``app`` whose current statement (still running) looks like ``like``."""
    with admin.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app "
                    "AND state = 'active' AND query LIKE :like"
                ),
                {"app": app, "like": like},
            ).scalar_one()
        )


def open_transactions(admin: Engine, app: str) -> list[tuple[int, str, str]]:
    """(pid, state, last query) of the backends of ``app`` that sit in an open transaction."""
    with admin.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT pid, state, query FROM pg_stat_activity WHERE application_name = :app "
                "AND state LIKE 'idle in transaction%'"
            ),
            {"app": app},
        )
        return [(row.pid, row.state, row.query) for row in rows]


def assert_no_open_transactions(admin: Engine, app: str, where: str, timeout: float = 5.0) -> None:
    """Nothing of ``app`` idle in transaction (polled: a closed backend may linger for a moment)."""
    deadline = time.monotonic() + timeout
    while rows := open_transactions(admin, app):
        if time.monotonic() > deadline:
            raise AssertionError(f"{where}: still idle in transaction after {timeout} s: {rows}")
        time.sleep(0.02)


@contextmanager
def slow_commits(admin: Engine, seconds: float, *, every: int = 0) -> Iterator[None]:
    """
    A deferred constraint trigger on ``items`` (PostgreSQL) that sleeps ``seconds`` in a COMMIT, so
    that a test can act while the COMMIT runs: for the first row inserted (``every=0``), or for
    every ``every``-th row (the trigger fires at COMMIT, once per row the transaction inserted).
    """
    which = "= 1" if every == 0 else f"% {int(every)} = 0"
    with admin.connect() as connection:
        connection.execute(text("CREATE SEQUENCE slow_commit_rows"))
        connection.execute(
            text(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN IF nextval('slow_commit_rows') {which} THEN "
                f"PERFORM pg_sleep({float(seconds)}); END IF; RETURN NULL; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON items "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
            )
        )
    try:
        yield
    finally:
        with admin.connect() as connection:
            connection.execute(text("DROP TRIGGER IF EXISTS slow_commit ON items"))
            connection.execute(text("DROP FUNCTION IF EXISTS slow_commit()"))
            connection.execute(text("DROP SEQUENCE IF EXISTS slow_commit_rows"))


@contextmanager
def no_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning (even ones the library might swallow when they are errors) and fail on any."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    messages = [f"{w.category.__name__}: {w.message}" for w in caught]
    assert not messages, f"warnings: {messages}"


# -- a private PostgreSQL that a test may restart --------------------------------------------------------


#: What the server logs each time it is ready for connections: after a start or a crash recovery.
_READY = "database system is ready to accept connections"


class PrivateServer:
    """
    An embedded PostgreSQL (the ``pgserver`` wheel) of one test's own, so it can be stopped and started.

    Its data directory is in ``directory``, by default a temporary directory of its own. Not under
    pytest's ``tmp_path``: as root, pgserver runs the server as another user, and every pytest
    process that starts on the machine makes ``/tmp/pytest-of-root`` private again (mode 0700),
    after which ``pg_ctl start`` of a data directory under it fails with "Permission denied" (seen
    when another session's tests started).
    """

    def __init__(self, directory: Path | None = None) -> None:
        if importlib.util.find_spec("pgserver") is None:
            pytest.skip("pgserver is not installed (it has no wheel for Python 3.13 and later)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR when run as root
            import pgserver

        self._pgserver = pgserver
        self._own_directory = directory is None
        self._directory = directory or Path(tempfile.mkdtemp(prefix="boundeddb-private-pg-"))
        self._server = pgserver.get_server(self._directory / "pgdata", cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self.socket_dir = info.socket_dir
        self.url: URL = make_url(self._server.get_uri())
        self.restarts = 0

    def _pg_ctl(self, *args: str) -> None:
        self._pgserver.pg_ctl(
            ["-w", *args], pgdata=self._server.pgdata, user=self._server.system_user, timeout=30
        )

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: every session is terminated (57P01), new ones are refused."""
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        """Start it again with the options pgserver used (unix socket only)."""
        self._pg_ctl("-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self._server.log), "start")
        self.restarts += 1

    @property
    def socket(self) -> str:
        """The path of its unix socket, for a proxy in front of it."""
        return f"{self.socket_dir}/.s.PGSQL.{self.url.port or 5432}"

    def configure(self, engine: Engine, **settings: str) -> None:
        """
        ``ALTER SYSTEM SET`` each of ``settings`` (as superuser, through ``engine``), then restart:
        a reload would reach the server's own processes (the WAL writer) a moment later, unseen.
        """
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            for name, value in settings.items():
                connection.exec_driver_sql(f"ALTER SYSTEM SET {name} = '{value}'")
        self.stop()
        self.start()

    def restart_immediately(self) -> None:
        """``pg_ctl stop -m immediate``, then start: a crash, whose recovery the new postmaster runs."""
        self._pg_ctl("-m", "immediate", "stop")
        self.start()

    def crash_backend(self, pid: int, timeout: float = 30.0) -> None:
        """
        SIGKILL backend ``pid``: the postmaster ends every session and reinitialises without
        restarting, recovering from the crash. Return once its log says it is ready again.
        """
        ready = self._log_count(_READY)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: self._log_count(_READY) > ready, timeout, "ready after a backend's crash")

    def _log_count(self, line: str) -> int:
        return Path(self._server.log).read_text(errors="replace").count(line)

    def cleanup(self) -> None:
        """
        Stop the server (pgserver only knows the first postmaster, not a restarted one), remove it.

        ``pg_ctl stop`` returns once the postmaster removed its pid file, a moment before the process
        is gone: pgserver, finding its postmaster still running then, would stop it again, fail, and
        fail again to signal it once it is gone (seen beside busy processes). So wait for it first.
        """
        import psutil  # pgserver's dependency

        pid_file = self._server.pgdata / "postmaster.pid"
        try:
            if pid_file.exists():
                postmaster = int(pid_file.read_text().split()[0])
                self._pg_ctl("-m", "immediate", "stop")
                psutil.wait_procs([psutil.Process(postmaster)], timeout=10)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):  # pragma: no cover
            pass
        except psutil.NoSuchProcess:  # pragma: no cover - gone before we looked
            pass
        self._server.cleanup()
        if self._own_directory:
            shutil.rmtree(self._directory, ignore_errors=True)
