"""
One set of unit factories per runner kind, so that one contract runs against every runner.

A kind is ``<strategy>[-<driver>]``: ``semaphore``, ``chunked`` (asyncpg), ``semaphore-psycopg``,
``threads-psycopg2``, ``chunked-asyncmy``, ``threads-pymysql``... A kind on a MySQL driver runs on
MariaDB/MySQL, the others on PostgreSQL; the Kit's ``db`` (tests/support/servers.py) speaks that server's SQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import ChunkedRunner, SemaphoreRunner, ThreadOffloadRunner
from tests.support.models import Item
from tests.support.servers import Database

#: (runner kind, anyio backend): the async runners need asyncio (asyncpg, AsyncSession);
#: the thread runner works under trio too.
CASES = [
    ("semaphore", "asyncio"),
    ("chunked", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg", "trio"),
    ("threads-psycopg2", "asyncio"),
]
CASE_IDS = [f"{kind}-{backend}" for kind, backend in CASES]
#: asyncio with uvloop's event loop (post 001 and 002 ran on it): the same runners, another loop.
UVLOOP = ("asyncio", {"use_uvloop": True})
#: The contract and cancellation tests also run every async-capable kind under uvloop.
UVLOOP_CASES = [("semaphore", UVLOOP), ("chunked", UVLOOP), ("threads-psycopg", UVLOOP)]
UVLOOP_IDS = [f"{kind}-uvloop" for kind, _ in UVLOOP_CASES]
#: The async runners on psycopg 3's async driver (``postgresql+psycopg`` with create_async_engine).
PSYCOPG_ASYNC_CASES = [("semaphore-psycopg", "asyncio"), ("chunked-psycopg", "asyncio")]
PSYCOPG_ASYNC_IDS = [f"{kind}-asyncio" for kind, _ in PSYCOPG_ASYNC_CASES]
#: On MariaDB/MySQL: the async runners on aiomysql and asyncmy (asyncio's drivers), the thread runner
#: on pymysql (under trio too); tests that take the ``db`` fixture (or a kit) get a database of their
#: own there.
MYSQL_CASES = [
    ("semaphore-aiomysql", "asyncio"),
    ("semaphore-asyncmy", "asyncio"),
    ("chunked-aiomysql", "asyncio"),
    ("chunked-asyncmy", "asyncio"),
    ("threads-pymysql", "asyncio"),
    ("threads-pymysql", "trio"),
]
MYSQL_IDS = [f"{kind}-{backend}" for kind, backend in MYSQL_CASES]
#: The async MySQL kinds under uvloop: both drivers, both async runners.
MYSQL_UVLOOP_CASES = [("semaphore-aiomysql", UVLOOP), ("chunked-asyncmy", UVLOOP)]
MYSQL_UVLOOP_IDS = [f"{kind}-uvloop" for kind, _ in MYSQL_UVLOOP_CASES]

#: Every stack: each runner on each driver and event loop, on PostgreSQL and MariaDB (18 kinds). For
#: what differs by driver: a transaction's end, cancellation, a connection cut mid-statement.
EVERY_STACK = CASES + UVLOOP_CASES + PSYCOPG_ASYNC_CASES + MYSQL_CASES + MYSQL_UVLOOP_CASES
EVERY_STACK_IDS = CASE_IDS + UVLOOP_IDS + PSYCOPG_ASYNC_IDS + MYSQL_IDS + MYSQL_UVLOOP_IDS
#: Each runner, on one real driver each (asyncpg; psycopg 3 in threads, under asyncio and trio): for
#: what the runner decides whatever the driver and the loop (order, limits, lookahead, counts), which
#: the in-memory fake executor (tests/core) checks too. EVERY_STACK runs the drivers' and uvloop's
#: side of the same paths: I/O, a transaction's end, cancellation.
EVERY_RUNNER = [case for case in CASES if case[0] != "threads-psycopg2"]
EVERY_RUNNER_IDS = [
    case_id for case, case_id in zip(CASES, CASE_IDS, strict=True) if case[0] != "threads-psycopg2"
]

#: The driver of a kind that names none: asyncpg for the async runners.
DEFAULT_ASYNC_DRIVER = "asyncpg"


def parse_kind(kind: str) -> tuple[str, str]:
    """(strategy, driver) of a kind: ``"chunked-asyncmy"`` -> ``("chunked", "asyncmy")``."""
    strategy, _, driver = kind.partition("-")
    return strategy, driver or DEFAULT_ASYNC_DRIVER


def scalar_unit(is_async: bool, statement: Any, params: dict[str, Any]) -> Callable[[Any], Any]:
    """A unit (async or sync) that runs ``statement`` with ``params`` and returns its one value as an int."""
    if is_async:

        async def unit(session: AsyncSession) -> int:
            return int((await session.execute(statement, params)).scalar_one())

        return unit

    def sync_unit(session: Session) -> int:
        return int(session.execute(statement, params).scalar_one())

    return sync_unit


class Boom(Exception):
    """A unit's own failure."""


class StartGate:
    """Lets a test wait, without sleeping, until ``n`` units have started (from any thread)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.started = 0
        self._lock = threading.Lock()
        self.event = anyio.Event()

    def arrive(self, *, from_thread: bool) -> None:
        with self._lock:
            self.started += 1
            reached = self.started == self.n
        if reached:
            if from_thread:
                anyio.from_thread.run_sync(self.event.set)
            else:
                self.event.set()


class Kit:
    """Builds a runner of one kind and units of the matching shape."""

    def __init__(self, kind: str, db: Database, make_async_engine: Any, make_sync_engine: Any) -> None:
        self.kind = kind
        self.db = db
        self.strategy, self.driver = parse_kind(kind)
        self.is_async = self.strategy != "threads"
        self._make_async_engine = make_async_engine
        self._make_sync_engine = make_sync_engine
        self.engine: Any = None

    def runner(self, limit: int = 5, *, pool_size: int | None = None, **options: Any) -> Any:
        """A runner of this kind; engine options among ``options`` (ENGINE_OPTIONS) go to its engine."""
        pool_size = pool_size or limit
        engine_options = _engine_options(options)
        if self.is_async:
            self.engine = self._make_async_engine(driver=self.driver, pool_size=pool_size, **engine_options)
            sessions: Any = async_sessionmaker(self.engine)
            if self.strategy == "chunked":
                return ChunkedRunner(sessions, chunk_size=limit, **options)
            return SemaphoreRunner(sessions, limit=limit, **options)
        self.engine = self._make_sync_engine(driver=self.driver, pool_size=pool_size, **engine_options)
        return ThreadOffloadRunner(sessionmaker(self.engine), limit=limit, **options)

    @property
    def pool(self) -> Any:
        return self.engine.sync_engine.pool if self.is_async else self.engine.pool

    # -- units --------------------------------------------------------------------------------------

    def insert(self, i: int, *, fail: bool = False, sleep: float = 0.0) -> Callable[[Any], Any]:
        """A unit that inserts row ``i`` (and optionally sleeps on the server, then fails)."""
        pause = text(self.db.sleep)
        if self.is_async:

            async def unit(session: AsyncSession) -> int:
                session.add(Item(key=f"k{i}", unit=i))
                await session.flush()
                if sleep:
                    await session.execute(pause, {"s": sleep})
                if fail:
                    raise Boom(i)
                return i

            return unit

        def sync_unit(session: Session) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            session.flush()
            if sleep:
                session.execute(pause, {"s": sleep})
            if fail:
                raise Boom(i)
            return i

        return sync_unit

    def select(self, value: int) -> Callable[[Any], Any]:
        """A unit that asks the server for ``value`` back."""
        return scalar_unit(self.is_async, text(f"SELECT {self.db.integer}"), {"v": value})

    def sleep_then_insert(self, i: int, seconds: float, gate: StartGate) -> Callable[[Any], Any]:
        """A unit that inserts row ``i``, reports it started, then sleeps on the server."""
        pause = text(self.db.sleep)
        if self.is_async:

            async def unit(session: AsyncSession) -> int:
                session.add(Item(key=f"k{i}", unit=i))
                await session.flush()
                gate.arrive(from_thread=False)
                await session.execute(pause, {"s": seconds})
                return i

            return unit

        def sync_unit(session: Session) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            session.flush()
            gate.arrive(from_thread=True)
            session.execute(pause, {"s": seconds})
            return i

        return sync_unit

    def map_fn(self) -> Callable[..., Any]:
        """``fn(session, item)`` for map(): twice the item, from the server."""
        twice = text(f"SELECT {self.db.integer} * 2")
        if self.is_async:

            async def fn(session: AsyncSession, item: int) -> int:
                return int((await session.execute(twice, {"v": item})).scalar_one())

            return fn

        def sync_fn(session: Session, item: int) -> int:
            return int(session.execute(twice, {"v": item}).scalar_one())

        return sync_fn


#: Options of Kit.runner() that are its engine's (``create_engine``'s), not the runner's.
ENGINE_OPTIONS = ("pool_timeout", "isolation_level")


def _engine_options(options: dict[str, Any]) -> dict[str, Any]:
    """Take the engine's options (ENGINE_OPTIONS) out of ``options``; one given as None is left out."""
    taken = {name: options.pop(name, None) for name in ENGINE_OPTIONS}
    return {name: value for name, value in taken.items() if value is not None}


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes (for server-side state that lags)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


__all__ = [
    "CASES",
    "CASE_IDS",
    "EVERY_RUNNER",
    "EVERY_RUNNER_IDS",
    "EVERY_STACK",
    "EVERY_STACK_IDS",
    "MYSQL_CASES",
    "MYSQL_IDS",
    "MYSQL_UVLOOP_CASES",
    "MYSQL_UVLOOP_IDS",
    "Boom",
    "Kit",
    "StartGate",
    "async_sessionmaker",
    "eventually",
    "sessionmaker",
]
