"""
The backend of a connection a runner discards ends on the server at once (issue #54, item 4).

A PostgreSQL backend does not notice that its client went away while it runs a statement, nor,
behind a half-open connection, while it waits with its transaction open; and a cancel request that
overtakes its statement on the way to the server is dropped. Each test puts the chaos soak's fault
proxy between the runner and the server and asks the server, straight, about the unit's backend:

- a ``COMMIT`` the proxy never forwards (the client is cut off, the server side stays open, as after
  a real network failure): the backend, idle in its transaction and holding a lock, must end within
  :data:`PROMISE_S`, not when the network gives up;
- a unit that times out while the proxy holds its statement back, so that the runner's cancel request
  reaches the server first and is dropped: the backend must end before the statement can run;
- the side connection that ends it frozen on its way (a half-open link): another one must end it
  within the same promise.

Through a pooler (PgBouncer) the driver's pid is not the server's, and nothing is terminated:
``tests/stacks/test_pgbouncer.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from boundeddb import SemaphoreRunner, ThreadOffloadRunner
from boundeddb.testing import PostgresServer, driver_url
from tests.chaos.proxy import FaultProxy, ProxyLoop

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]

#: How soon after the runner hands back a unit whose connection it discarded its backend has ended.
PROMISE_S = 2.0
#: How long the proxy keeps a cut connection's server side open, or holds a statement back: far
#: longer than the promise, so that only an ended backend passes.
HELD_S = 8.0
#: How long new connections are refused after the COMMIT is lost (the side connection tried again).
REFUSED_S = 1.5
#: The advisory lock the unit takes and that must be free again once its backend has ended.
LOCK = 54_004
ASYNC_DRIVERS = ["asyncpg", "psycopg"]
KINDS = [f"semaphore-{driver}" for driver in ASYNC_DRIVERS] + ["threads-psycopg", "threads-psycopg2"]


class World:
    """A fault proxy in front of the test server, a runner of one kind through it, and a direct way in."""

    def __init__(self, loop: ProxyLoop, server: PostgresServer, app: str) -> None:
        url = server.url
        upstream: tuple[str, int] | str
        if url.host:
            upstream = (url.host, url.port or 5432)
        else:  # the embedded server: its unix socket
            upstream = f"{url.query['host']}/.s.PGSQL.{url.port or 5432}"
        self.proxy = FaultProxy(loop, upstream, "postgresql")
        self.url: URL = url.set(host="127.0.0.1", port=self.proxy.port, query={})
        self.app = app
        self.direct: Engine = create_engine(driver_url(url, "psycopg"), poolclass=NullPool)
        self.engines: list[Any] = []

    def runner(self, kind: str, *, timeout: float | None = None) -> Any:
        """A runner of ``kind`` (``semaphore-<driver>``, ``threads-<driver>``), ``limit=1``, via the proxy."""
        flavour, driver = kind.split("-")
        pool = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 5}
        if flavour == "threads":
            args = {"application_name": self.app}
            engine: Any = create_engine(driver_url(self.url, driver), connect_args=args, **pool)  # type: ignore[arg-type]
            self.engines.append(engine)
            return ThreadOffloadRunner(sessionmaker(engine), limit=1, timeout=timeout, errors="collect")
        if driver == "asyncpg":
            args = {"ssl": False, "server_settings": {"application_name": self.app}}
        else:
            args = {"application_name": self.app}
        engine = create_async_engine(driver_url(self.url, driver), connect_args=args, **pool)  # type: ignore[arg-type]
        self.engines.append(engine)
        return SemaphoreRunner(async_sessionmaker(engine), limit=1, timeout=timeout, errors="collect")

    def alive(self, pid: int) -> bool:
        """Whether backend ``pid`` is still on the server."""
        with self.direct.connect() as connection:
            sql = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
            return bool(connection.execute(sql, {"pid": pid}).scalar_one())

    def lock_free(self) -> bool:
        """Whether the unit's advisory lock can be taken (and is let go at once)."""
        with self.direct.connect() as connection:
            taken = bool(connection.execute(text(f"SELECT pg_try_advisory_lock({LOCK})")).scalar_one())
            if taken:
                connection.execute(text(f"SELECT pg_advisory_unlock({LOCK})"))
            return taken

    def ended_within(self, pid: int, seconds: float) -> float | None:
        """How soon backend ``pid`` was gone, polling the server; None if not within ``seconds``."""
        start = time.monotonic()
        while self.alive(pid):
            if time.monotonic() - start > seconds:
                return None
            time.sleep(0.02)
        return time.monotonic() - start

    async def close(self) -> None:
        for engine in self.engines:
            if hasattr(engine, "sync_engine"):
                await engine.dispose()
            else:
                engine.dispose()
        self.proxy.close()
        self.direct.dispose()


@pytest.fixture
def anyio_backend() -> str:
    """asyncio: the async drivers run on it only, and one loop is enough for the thread runner's case."""
    return "asyncio"


@pytest.fixture
async def world(pg_server: PostgresServer, app_name: str) -> Any:
    loop = ProxyLoop()
    made = World(loop, pg_server, app_name)
    try:
        yield made
    finally:
        await made.close()
        loop.close()


async def _pid_and_lock_async(session: AsyncSession) -> int:
    await session.execute(text(f"SELECT pg_advisory_xact_lock({LOCK})"))
    return int((await session.execute(text("SELECT pg_backend_pid()"))).scalar_one())


def _pid_and_lock_sync(session: Session) -> int:
    session.execute(text(f"SELECT pg_advisory_xact_lock({LOCK})"))
    return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _locking_unit(kind: str, pids: list[int]) -> Any:
    """A unit for a runner of ``kind``: takes the advisory lock, appends its backend's pid to ``pids``."""
    if kind.startswith("threads"):

        def unit(session: Session) -> None:
            pids.append(_pid_and_lock_sync(session))

        return unit

    async def async_unit(session: AsyncSession) -> None:
        pids.append(await _pid_and_lock_async(session))

    return async_unit


async def _run_one(runner: Any, unit: Any) -> Any:
    async with runner:
        report = await runner.run([unit])
    [outcome] = report.outcomes
    return outcome


@pytest.mark.parametrize("kind", KINDS)
async def test_a_dropped_commit_ends_its_backend(world: World, kind: str) -> None:
    """A COMMIT that never reaches the server: its backend (idle in transaction, a lock held) ends at once."""
    pids: list[int] = []
    unit = _locking_unit(kind, pids)
    trap = world.proxy.arm_commit("drop")
    outcome = await _run_one(world.runner(kind), unit)
    assert trap.fired.is_set()
    assert outcome.commit_unknown, outcome
    ended = await anyio.to_thread.run_sync(world.ended_within, pids[0], PROMISE_S)
    assert ended is not None, f"backend {pids[0]} still on the server {PROMISE_S} s after the COMMIT was lost"
    assert await anyio.to_thread.run_sync(world.lock_free)


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
async def test_a_timed_out_statement_whose_cancel_was_lost_never_runs(world: World, driver: str) -> None:
    """A unit times out while its statement is held back: its cancel request is dropped, its backend ended."""
    pids: list[int] = []

    async def unit(session: AsyncSession) -> None:
        pids.append(await _pid_and_lock_async(session))
        await anyio.to_thread.run_sync(world.proxy.hold_next_statement, HELD_S)
        await session.execute(text("SELECT pg_sleep(30)"))

    started = time.monotonic()
    outcome = await _run_one(world.runner(f"semaphore-{driver}", timeout=1.0), unit)
    assert type(outcome.error).__name__ == "UnitTimeout", outcome
    assert time.monotonic() - started < HELD_S  # the statement was still held back when the unit timed out
    ended = await anyio.to_thread.run_sync(world.ended_within, pids[0], PROMISE_S)
    assert ended is not None, f"backend {pids[0]} still on the server {PROMISE_S} s after its unit timed out"
    assert await anyio.to_thread.run_sync(world.lock_free)


@pytest.mark.parametrize("kind", ["semaphore-asyncpg", "threads-psycopg"])
async def test_a_backend_is_ended_once_the_server_can_be_reached_again(world: World, kind: str) -> None:
    """New connections refused as the COMMIT is lost: the side connection is tried again, ends the backend."""
    pids: list[int] = []
    unit = _locking_unit(kind, pids)

    def refuse_then_allow() -> None:
        world.proxy.refuse_new(True)
        threading.Timer(REFUSED_S, world.proxy.refuse_new, (False,)).start()

    world.proxy.arm_commit("drop", then=refuse_then_allow)
    outcome = await _run_one(world.runner(kind), unit)
    assert outcome.commit_unknown, outcome
    ended = await anyio.to_thread.run_sync(world.ended_within, pids[0], REFUSED_S + PROMISE_S)
    assert ended is not None, f"backend {pids[0]} still on the server after the server could be reached again"
    assert await anyio.to_thread.run_sync(world.lock_free)


@pytest.mark.parametrize("kind", ["semaphore-asyncpg", "threads-psycopg", "threads-psycopg2"])
async def test_a_side_connection_frozen_on_its_way_is_given_up_for_another(world: World, kind: str) -> None:
    """The side connection's link freezes as it asks to end the backend: another one ends it in time."""
    pids: list[int] = []
    unit = _locking_unit(kind, pids)
    world.proxy.freeze_at(b"pg_terminate_backend")
    world.proxy.arm_commit("drop")
    outcome = await _run_one(world.runner(kind), unit)
    assert outcome.commit_unknown, outcome
    ended = await anyio.to_thread.run_sync(world.ended_within, pids[0], PROMISE_S)
    assert world.proxy.frozen_at == 1  # the first side connection froze
    assert ended is not None, f"backend {pids[0]} still on the server {PROMISE_S} s after, its ender frozen"
    assert await anyio.to_thread.run_sync(world.lock_free)
