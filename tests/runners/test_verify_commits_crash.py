"""
verify_commits=True across a server crash: a lost COMMIT is never reported committed unless it is.

After a crash, PostgreSQL hands out again the ids of transactions that never reached the WAL on disk,
so ``pg_xact_status()`` of such an id may answer for another transaction. Each test runs a private
server (``PrivateServer``: it may crash) behind the chaos soak's fault proxy, which drops a unit's
``COMMIT`` (or its reply), cuts the client off and holds the runner's question on a new connection
while the test crashes the server (an immediate restart, or a backend killed, after which the
postmaster reinitialises without restarting) and, straight to the server, runs the transactions
that take the ids again. Then the question goes through. The server's WAL writer sleeps 10 s between
rounds, so that a unit's insert is still in memory when the server crashes, and autovacuum is off,
so that nothing but the test writes. Units and questions run as a role that is not a superuser.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

import boundeddb._executors.verify
from boundeddb import Outcome, SemaphoreRunner, ThreadOffloadRunner
from boundeddb._dialects.postgresql import DIALECT
from boundeddb.testing import driver_url
from tests.chaos.proxy import FaultProxy, ProxyLoop
from tests.support.faults import PrivateServer, wait_until
from tests.support.models import Base, Item

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage", "long_wait")]

Crash = Literal["restart", "backend"]
#: How the server crashes: ``pg_ctl stop -m immediate`` and start, or a backend killed (SIGKILL).
CRASHES: list[Crash] = ["restart", "backend"]
#: The runners: an async one on asyncpg, a thread one on psycopg 3.
KINDS = ["semaphore-asyncpg", "threads-psycopg"]
#: The role units and questions run as, and its schema.
ROLE = "verify_unit"
#: How many transactions, straight to the server after the crash, take ids again.
REUSERS = 20
#: What the verifier logs when it does not believe a "committed" after a crash.
NOT_BELIEVED = "may have handed out again"
_READ_ID = "SELECT CAST(pg_current_xact_id() AS text)"


class Heard(logging.Handler):
    """What the ``boundeddb.verify`` logger said; ``heard`` is set once it says ``words``."""

    def __init__(self, words: str) -> None:
        super().__init__(logging.DEBUG)
        self.words = words
        self.heard = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.messages.append(message)
        if self.words in message:
            self.heard.set()


class CrashWorld:
    """A private server, a fault proxy in front of it, and the superuser's own way in, past the proxy."""

    def __init__(self, server: PrivateServer) -> None:
        self.server = server
        self.direct = create_engine(driver_url(server.url, "psycopg"), poolclass=NullPool)
        server.configure(self.direct, wal_writer_delay="10s", autovacuum="off")
        with self.direct.begin() as connection:
            connection.exec_driver_sql(f"CREATE ROLE {ROLE} LOGIN")
            connection.exec_driver_sql(f"CREATE SCHEMA AUTHORIZATION {ROLE}")  # first on its search_path
        as_role = create_engine(driver_url(server.url.set(username=ROLE), "psycopg"), poolclass=NullPool)
        Base.metadata.create_all(as_role)
        with as_role.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE others (n int)")
        as_role.dispose()
        self.engines: list[Any] = []
        self.loop = ProxyLoop()
        self.proxy = FaultProxy(self.loop, server.socket, "postgresql")

    def runner(self, kind: str) -> Any:
        """A runner of ``kind`` with ``verify_commits=True`` and ``limit=1``, connected through the proxy."""
        url = self.server.url.set(username=ROLE, host="127.0.0.1", port=self.proxy.port, query={})
        pool = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 5}
        if kind == "threads-psycopg":
            engine: Any = create_engine(driver_url(url, "psycopg"), **pool)
            self.engines.append(engine)
            return ThreadOffloadRunner(sessionmaker(engine), limit=1, verify_commits=True, errors="collect")
        engine = create_async_engine(driver_url(url, "asyncpg"), connect_args={"ssl": False}, **pool)
        self.engines.append(engine)
        return SemaphoreRunner(async_sessionmaker(engine), limit=1, verify_commits=True, errors="collect")

    def crash(self, how: Crash) -> None:
        """Crash the server as ``how`` says; return once it accepts connections again."""
        if how == "restart":
            self.server.restart_immediately()
            return
        witness = self.direct.connect()
        pid = int(witness.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        self.server.crash_backend(pid)
        witness.invalidate()
        witness.close()

    def hand_out_ids(self, count: int = REUSERS) -> list[int]:
        """``count`` writing transactions, straight to the server, committed: their ids."""
        ids = []
        with self.direct.connect() as connection:
            for _ in range(count):
                connection.exec_driver_sql(f"INSERT INTO {ROLE}.others VALUES (1)")
                ids.append(int(connection.exec_driver_sql(_READ_ID).scalar_one()))
                connection.commit()
        return ids

    def next_id(self) -> int:
        """``pg_snapshot_xmax``: no transaction at or after it has ended."""
        with self.direct.connect() as connection:
            sql = "SELECT CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text)"
            return int(connection.exec_driver_sql(sql).scalar_one())

    def units(self) -> list[int]:
        """The ``unit`` of every row of ``items``."""
        with self.direct.connect() as connection:
            return sorted(connection.exec_driver_sql(f"SELECT unit FROM {ROLE}.items").scalars())

    async def close(self) -> None:
        """Dispose of the engines, close the proxy and its loop (not the server)."""
        for engine in self.engines:
            if hasattr(engine, "sync_engine"):
                await engine.dispose()
            else:
                engine.dispose()
        self.proxy.close()
        self.loop.close()
        self.direct.dispose()


@pytest.fixture
async def world() -> AsyncIterator[CrashWorld]:  # async: the async engines are disposed of on the loop
    """A crashable private server behind a fault proxy (skipped where pgserver has no wheel)."""
    server = PrivateServer()
    try:
        crash_world = CrashWorld(server)
        try:
            yield crash_world
        finally:
            await crash_world.close()
    finally:
        server.cleanup()


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Runners ask for up to 60 s: a crash and its recovery beside busy processes must not outlast the
    wait, which would make a unit commit_unknown for want of an answer. No test waits it out.
    """
    monkeypatch.setattr(boundeddb._executors.verify, "WAIT_S", 60.0)


@pytest.fixture
def listen() -> Iterator[Callable[[str], Heard]]:
    """``listen(words)``: what ``boundeddb.verify`` says from now on, DEBUG and up, and whether ``words``."""
    logger = logging.getLogger("boundeddb.verify")
    level = logger.level
    handlers: list[Heard] = []

    def start(words: str) -> Heard:
        handler = Heard(words)
        handlers.append(handler)
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        return handler

    yield start
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)


def inserting(kind: str, i: int, ids: dict[int, int], first: Sequence[str] = ()) -> Any:
    """A unit that runs ``first``, inserts row ``i`` and notes its transaction's id in ``ids[i]``."""
    if kind == "threads-psycopg":

        def sync_unit(session: Session) -> int:
            for statement in first:
                session.execute(text(statement))
            session.add(Item(key=f"k{i}", unit=i))
            session.flush()
            ids[i] = int(session.execute(text(_READ_ID)).scalar_one())
            return i

        return sync_unit

    async def unit(session: AsyncSession) -> int:
        for statement in first:
            await session.execute(text(statement))
        session.add(Item(key=f"k{i}", unit=i))
        await session.flush()
        ids[i] = int((await session.execute(text(_READ_ID))).scalar_one())
        return i

    return unit


async def lose_commit(
    world: CrashWorld,
    kind: str,
    mode: Literal["drop", "drop-reply"],
    meanwhile: Callable[[int], None],
    then: Callable[[], None] = lambda: None,
) -> tuple[Outcome[Any], int]:
    """
    Unit 1's COMMIT cut as ``mode`` says; ``meanwhile(its transaction id)`` runs in a thread while
    the runner's question waits at the proxy; then the question goes through, and ``then()`` runs.
    Unit 1's outcome, and its transaction id.
    """
    runner = world.runner(kind)
    ids: dict[int, int] = {}
    assert (await runner.run([inserting(kind, 0, ids)])).values() == [0]  # its connection is open
    world.proxy.hold_new()  # the question goes out on a new connection: it waits
    trap = world.proxy.arm_commit(mode)
    report: Any = None

    async def run() -> None:
        nonlocal report
        report = await runner.run([inserting(kind, 1, ids)])

    def fault() -> None:
        try:
            assert trap.fired.wait(30), "the unit's COMMIT never came"
            meanwhile(ids[1])
        finally:
            world.proxy.release_new()
        then()

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await anyio.to_thread.run_sync(fault)
    [outcome] = report.outcomes
    return outcome, ids[1]


def verdict(outcome: Outcome[Any]) -> tuple[bool, bool, bool, int]:
    """``(ok, commit_unknown, commit_verified, attempts)``."""
    return outcome.ok, outcome.commit_unknown, outcome.commit_verified, outcome.attempts


UNKNOWN = (False, True, False, 1)
ABORTED = (False, False, True, 1)


# -- the id handed out again: never ok --------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("crash", CRASHES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_commit_lost_in_a_crash_whose_id_is_handed_out_again_is_not_ok(
    world: CrashWorld, listen: Callable[[str], Heard], kind: str, crash: Crash
) -> None:
    """COMMIT never sent, a crash, 20 new transactions take its id again: commit_unknown, and no row."""
    said = listen(NOT_BELIEVED)
    handed_out: list[int] = []

    def crash_and_reuse(xid: int) -> None:
        world.crash(crash)
        handed_out.extend(world.hand_out_ids())

    outcome, xid = await lose_commit(world, kind, "drop", crash_and_reuse)
    assert xid in handed_out, f"the unit's id {xid} was not handed out again: {handed_out}"
    assert verdict(outcome) == UNKNOWN, said.messages
    assert said.heard.is_set(), said.messages
    assert world.units() == [0]


# -- an id not handed out again: aborted, provably --------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("crash", CRASHES)
async def test_a_commit_lost_in_a_crash_whose_id_is_not_handed_out_again_is_aborted(
    world: CrashWorld, listen: Callable[[str], Heard], crash: Crash
) -> None:
    """COMMIT never sent, a crash, no transaction since: its id not handed out again, so aborted, no row."""
    said = listen("the server aborted it")
    next_ids: list[int] = []

    def crash_only(xid: int) -> None:
        world.crash(crash)
        next_ids.append(world.next_id())

    outcome, xid = await lose_commit(world, "semaphore-asyncpg", "drop", crash_only)
    assert next_ids[0] <= xid, "the recovered server was past the unit's id"
    assert verdict(outcome) == ABORTED, said.messages
    assert said.heard.is_set(), said.messages
    assert world.units() == [0]


# -- the server committed, then crashed: not provable, so unknown -----------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("crash", CRASHES)
async def test_a_commit_made_durable_before_a_crash_is_unknown_not_ok(
    world: CrashWorld, listen: Callable[[str], Heard], crash: Crash
) -> None:
    """
    The server commits (to disk), the reply is lost, a crash: the row survives, but a "committed"
    after a crash may be another transaction's, so the unit is commit_unknown.
    """
    said = listen(NOT_BELIEVED)
    handed_out: list[int] = []

    def commit_then_crash(xid: int) -> None:
        # Another session sees the row once the commit record is on disk (synchronous_commit is on).
        wait_until(lambda: world.units() == [0, 1], 30, "the unit's COMMIT done on the server")
        world.crash(crash)
        handed_out.extend(world.hand_out_ids())

    outcome, xid = await lose_commit(world, "semaphore-asyncpg", "drop-reply", commit_then_crash)
    assert min(handed_out) > xid, "a commit on disk moves the next id past its own"
    assert verdict(outcome) == UNKNOWN, said.messages
    assert said.heard.is_set(), said.messages
    assert world.units() == [0, 1]


# -- the id handed out again to a transaction still running: asked again ----------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("ending", ["commit", "rollback"])
async def test_an_id_taken_by_a_transaction_still_running_after_a_crash_is_asked_about_again(
    world: CrashWorld, listen: Callable[[str], Heard], ending: str
) -> None:
    """
    After a crash another transaction holds the unit's id: "in progress", asked again; once it
    commits, commit_unknown (it may be the other's); once it rolls back, aborted.
    """
    asking_again = listen("in progress; asking again")
    holders: list[Any] = []

    def crash_and_hold(xid: int) -> None:
        world.crash("restart")
        world.hand_out_ids(xid - world.next_id())  # the ids before the unit's
        holders.append(holder := world.direct.connect())
        holder.exec_driver_sql(f"INSERT INTO {ROLE}.others VALUES (2)")
        taken = int(holder.exec_driver_sql(_READ_ID).scalar_one())
        assert taken == xid, f"the holder got {taken}, not the unit's {xid}"
        # A later id ends: else no transaction at or after the unit's id has ended since the crash,
        # which tells that the unit's did not commit (the test before this one).
        assert world.hand_out_ids(1) == [xid + 1]

    def end_the_holder() -> None:
        try:
            assert asking_again.heard.wait(30), asking_again.messages
        finally:
            for holder in holders:
                if ending == "commit":
                    holder.commit()
                else:
                    holder.rollback()
                holder.close()

    outcome, _ = await lose_commit(world, "semaphore-asyncpg", "drop", crash_and_hold, end_the_holder)
    assert verdict(outcome) == (UNKNOWN if ending == "commit" else ABORTED), asking_again.messages
    assert world.units() == [0]


# -- no crash: the incarnation reads the same in any session ------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_lost_commit_in_odd_session_settings_is_still_verified_without_a_crash(
    world: CrashWorld, kind: str
) -> None:
    """The unit's session has its own TimeZone, DateStyle and float digits: a cut COMMIT is still verified."""
    runner = world.runner(kind)
    odd = [
        "SET LOCAL TimeZone = 'Asia/Kathmandu'",
        "SET LOCAL DateStyle = 'SQL, DMY'",
        "SET LOCAL extra_float_digits = -15",
    ]
    world.proxy.arm_commit("drop-reply")
    with anyio.fail_after(60):
        report = await runner.run([inserting(kind, 0, {}, first=odd)])
    [outcome] = report.outcomes
    assert (outcome.ok, outcome.value, outcome.commit_verified, outcome.attempts) == (True, 0, True, 1)
    assert world.units() == [0]


def test_a_value_the_xid_statement_did_not_read_is_refused() -> None:
    """xact_status_sql() of a bare id (no incarnation) raises, rather than ask about it without one."""
    with pytest.raises(ValueError, match=r"^not a value of current_xid_sql: '731'$"):
        DIALECT.xact_status_sql("731")
    assert "CAST('731' AS xid8)" in DIALECT.xact_status_sql("731 1796650639747894 0/1498680")
