"""Fault injection: killed backends, restarts, contention, hangs, cancellation, Ctrl-C, misuse, load."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from sqlalchemy import create_engine, event, insert, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, selectinload, sessionmaker
from sqlalchemy.orm.exc import DetachedInstanceError, StaleDataError
from sqlalchemy.pool import NullPool

from boundeddb import (
    RetryPolicy,
    SemaphoreRunner,
    ThreadOffloadRunner,
    UnitMisuseError,
    UnitTimeout,
    is_transient,
)
from boundeddb.testing import driver_url
from tests.conftest import (
    ActivitySampler,
    Base,
    Item,
    backends,
    committed_units,
)
from tests.faults import (
    Account,
    Child,
    ConnectAttempts,
    Countdown,
    FaultBase,
    InsufficientFunds,
    Killer,
    Parent,
    PrivateServer,
    Progress,
    active_queries,
    assert_no_open_transactions,
    check_commit_invariant,
    codes_of,
    fault_tables,
    is_refused,
    no_warnings,
    unexpected_failures,
    wait_until,
)
from tests.kits import Boom, Kit, StartGate, eventually

pytestmark = [pytest.mark.postgres]


class FaultKit(Kit):
    """tests.kits.Kit, whose runner() also passes engine options (``isolation_level=``) through."""

    def runner(self, limit: int = 5, *, pool_size: int | None = None, **options: Any) -> Any:
        engine_options = {name: options.pop(name) for name in ("isolation_level",) if name in options}
        make_async, make_sync = self._make_async_engine, self._make_sync_engine
        if engine_options:
            self._make_async_engine = partial(make_async, **engine_options) if make_async else None
            self._make_sync_engine = partial(make_sync, **engine_options)
        try:
            return super().runner(limit, pool_size=pool_size, **options)
        finally:
            self._make_async_engine, self._make_sync_engine = make_async, make_sync


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect garbage as each test ends: a leaked connection then fails its own test, not a later one."""
    yield
    gc.collect()


@pytest.fixture
def kit(kind: str, request: pytest.FixtureRequest, make_sync_engine: Any) -> FaultKit:
    # The async engine factory is an asyncio-only fixture: ask for it only where it is needed.
    async_factory = None if kind.startswith("threads") else request.getfixturevalue("make_async_engine")
    return FaultKit(kind, async_factory, make_sync_engine)


@pytest.fixture
def make_async_engine_without_ssl_probe(make_async_engine: Any) -> Any:
    """
    conftest's make_async_engine, but with asyncpg's ``ssl=False`` (the test server has no TLS).

    With its default sslmode=prefer, asyncpg opens each connection with an SSLRequest probe; a connect
    cancelled during the probe leaves a "Future exception was never retrieved: ConnectionError:
    unexpected connection_lost() call" for the event loop to report (asyncpg's TLSUpgradeProto,
    MagicStack/asyncpg#1211 and #1310). That is the driver's noise, not boundeddb's: turn the probe off
    where a test cancels units that may be connecting.
    """
    return partial(make_async_engine, ssl=False)


@pytest.fixture
def reap_backends(admin: Engine, app_name: str) -> Iterator[None]:
    """At teardown, terminate this test's backends: a leaked one in a transaction would block DROP TABLE."""
    yield
    terminate_backends(admin, app_name)


def terminate_backends(admin: Engine, app: str) -> None:
    with admin.connect() as connection:
        connection.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :app"),
            {"app": app},
        )


@pytest.fixture
def cancel_kit(kind: str, request: pytest.FixtureRequest, make_sync_engine: Any) -> FaultKit:
    async_factory = (
        None if kind.startswith("threads") else request.getfixturevalue("make_async_engine_without_ssl_probe")
    )
    return FaultKit(kind, async_factory, make_sync_engine)


# -- 1. kill: pg_terminate_backend on the runner's backends, again and again ------------------------------

KILL_UNITS = 5000


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


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize(
    ("kind", "anyio_backend"),
    [("semaphore", "asyncio"), ("threads-psycopg", "asyncio")],
    ids=["semaphore-asyncio", "threads-psycopg-asyncio"],
)
async def test_killed_backends_are_retried_and_never_commit_twice(
    kit: Kit, admin: Engine, app_name: str
) -> None:
    """5,000 inserts while their backends are terminated: no hang, no leak, every row accounted for."""
    runner = kit.runner(limit=10, errors="collect", retry=RetryPolicy(attempts=10, initial_delay=0.01))
    progress = Progress()
    killer = Killer(
        admin, app_name, progress, start_at=KILL_UNITS // 10, stop_at=KILL_UNITS * 9 // 10, every=0.05
    )
    with anyio.fail_after(90), killer:
        report = await runner.run(inserting(kit.is_async, i, progress) for i in range(KILL_UNITS))
    outcomes = report.outcomes
    print(
        f"terminated={killer.terminated} rounds={killer.rounds} retried={report.stats.retried} "
        f"failed={report.stats.failed} commit_unknown={sum(o.commit_unknown for o in outcomes)} "
        f"elapsed={report.stats.elapsed_s:.1f}s"
    )
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after the kills")
    check_commit_invariant(outcomes, committed_units(admin), KILL_UNITS)
    assert report.stats.peak_connections <= runner.limit
    assert killer.terminated > 0
    assert report.stats.retried > 0
    assert unexpected_failures(outcomes) == []


# -- 2. restart: a private server is stopped (-m fast) and started again mid-run ---------------------------

RESTART_UNITS = 1000


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[PrivateServer]:
    """An embedded PostgreSQL of this test's own: the shared server must never be restarted."""
    server = PrivateServer(tmp_path / "pgdata")
    try:
        yield server
    finally:
        server.cleanup()


def select_unit(is_async: bool, value: int) -> Any:
    if is_async:

        async def unit(session: AsyncSession) -> int:
            return int((await session.execute(text(f"SELECT {value}"))).scalar_one())

        return unit

    def sync_unit(session: Session) -> int:
        return int(session.execute(text(f"SELECT {value}")).scalar_one())

    return sync_unit


class PrivateRunner:
    """A runner of one kind on the private server, and how to dispose of its engine."""

    def __init__(self, kind: str, server: PrivateServer, retry: RetryPolicy, limit: int = 5) -> None:
        self.is_async = kind == "semaphore"
        self.app = f"bdbt-private-{os.getpid()}"
        if self.is_async:
            self.async_engine = create_async_engine(
                driver_url(server.url, "asyncpg"),
                pool_size=limit,
                max_overflow=0,
                connect_args={"server_settings": {"application_name": self.app}},
            )
            self.engine = self.async_engine.sync_engine
            self.runner: Any = SemaphoreRunner(
                async_sessionmaker(self.async_engine), limit=limit, errors="collect", retry=retry
            )
        else:
            driver = kind.removeprefix("threads-")
            self.engine = create_engine(
                driver_url(server.url, driver),  # type: ignore[arg-type]
                pool_size=limit,
                max_overflow=0,
                connect_args={"application_name": self.app},
            )
            self.runner = ThreadOffloadRunner(
                sessionmaker(self.engine), limit=limit, errors="collect", retry=retry
            )
        self.connects = ConnectAttempts(self.engine)

    @property
    def pool(self) -> Any:
        return self.engine.pool

    async def dispose(self) -> None:
        if self.is_async:
            await self.async_engine.dispose()
        else:
            self.engine.dispose()


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "anyio_backend"),
    [("semaphore", "asyncio"), ("threads-psycopg", "asyncio")],
    ids=["semaphore-asyncio", "threads-psycopg-asyncio"],
)
async def test_a_server_restart_mid_run_is_survived_or_reported(
    kind: str, private_server: PrivateServer
) -> None:
    """Stop -m fast and start mid-run: every unit has an outcome, no hang, and the runner works after."""
    server = private_server
    admin = create_engine(driver_url(server.url, "psycopg"), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    Base.metadata.create_all(admin)
    private = PrivateRunner(kind, server, RetryPolicy(attempts=10, initial_delay=0.02, max_delay=0.5))
    progress = Progress()

    def restart() -> None:
        assert progress.wait_for(RESTART_UNITS // 5, 30), "the run did not get going"
        server.stop()
        # Let units run into the stopped server before it comes back (with a deadline).
        before = private.connects.value
        assert private.connects.wait_for(before + 3, 20), "no unit tried to connect to the stopped server"
        server.start()

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(partial(anyio.to_thread.run_sync, restart, abandon_on_cancel=True))
                report = await private.runner.run(
                    inserting(private.is_async, i, progress) for i in range(RESTART_UNITS)
                )
        print(
            f"restart: retried={report.stats.retried} failed={report.stats.failed} "
            f"commit_unknown={sum(o.commit_unknown for o in report.outcomes)} "
            f"kinds={sorted({type(o.error).__name__ for o in report.failures})}"
        )
        assert server.restarts == 1
        assert private.pool.checkedout() == 0
        assert report.stats.retried > 0
        # Units may fail after their retries (see the refused-connection test below), but only
        # with a lost or refused connection, never with anything else (a double commit, say).
        assert unexpected_failures(report.outcomes, also=is_refused) == []
        with admin.connect() as connection:
            rows = list(connection.execute(text("SELECT unit FROM items")).scalars())
        assert_no_open_transactions(admin, private.app, "after the restart")
        check_commit_invariant(report.outcomes, rows, RESTART_UNITS)
        # The same runner and pool work afterwards.
        with anyio.fail_after(30):
            again = await private.runner.run(select_unit(private.is_async, i) for i in range(50))
        assert again.values() == list(range(50))
        assert private.pool.checkedout() == 0
    finally:
        await private.dispose()
        admin.dispose()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "anyio_backend"),
    [("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("threads-psycopg2", "asyncio")],
    ids=["semaphore-asyncio", "threads-psycopg-asyncio", "threads-psycopg2-asyncio"],
)
async def test_a_unit_that_meets_a_stopped_server_is_retried_until_it_is_back(
    kind: str, private_server: PrivateServer
) -> None:
    """A refused connection (server down for a restart) is transient: the unit retries and succeeds."""
    server = private_server
    server.stop()
    private = PrivateRunner(kind, server, RetryPolicy(attempts=100, initial_delay=0.02, max_delay=0.1))

    async def start_after_refusals() -> None:
        refused = await anyio.to_thread.run_sync(private.connects.wait_for, 2, 10, abandon_on_cancel=True)
        if refused:
            await anyio.to_thread.run_sync(server.start)

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(start_after_refusals)
                report = await private.runner.run([select_unit(private.is_async, 7)])
                group.cancel_scope.cancel()
        outcome = report.outcomes[0]
        assert outcome.ok, (
            f"the unit met the stopped server and was not retried after {outcome.attempts} attempt(s): "
            f"{type(outcome.error).__qualname__}: {outcome.error}"
        )
        assert outcome.value == 7
        assert outcome.attempts >= 2
        assert server.restarts == 1
    finally:
        await private.dispose()


# -- 3. contention: transfer() between few accounts, under real serialization failures and deadlocks -------

ACCOUNTS = 4
OPENING_BALANCE = 1000
TRANSFERS = 150


@pytest.fixture
def accounts(admin: Engine) -> Iterator[None]:
    """``ACCOUNTS`` accounts holding ``OPENING_BALANCE`` each, at version 1."""
    tables = fault_tables("fault_accounts")
    FaultBase.metadata.drop_all(admin, tables=tables)
    FaultBase.metadata.create_all(admin, tables=tables)
    with admin.connect() as connection:
        connection.execute(
            insert(Account),
            [{"id": i, "balance": OPENING_BALANCE, "version": 1} for i in range(ACCOUNTS)],
        )
    yield
    FaultBase.metadata.drop_all(admin, tables=tables)


class Ledger:
    """What the transfer units saw: every error by SQLSTATE (or class name), from any thread."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def saw(self, error: BaseException) -> None:
        key = codes_of(error) if isinstance(error, sa_exc.DBAPIError) else None
        with self._lock:
            self.seen[key or type(error).__name__] += 1


Transfer = tuple[int, int, int]

#: Deadlocks are found after deadlock_timeout (1 s by default): keep the test quick.
FAST_DEADLOCKS = "SET LOCAL deadlock_timeout = '20ms'"
LOCK = "SELECT balance FROM fault_accounts WHERE id = :id FOR UPDATE"
MOVE = "UPDATE fault_accounts SET balance = balance + :delta, version = version + 1 WHERE id = :id"


def locking_transfer(is_async: bool, payer: int, payee: int, amount: int, ledger: Ledger) -> Any:
    """transfer() as in the seed: lock the payer and the payee (in that order: deadlocks happen), move."""
    if is_async:

        async def unit(session: AsyncSession) -> Transfer:
            try:
                await session.execute(text(FAST_DEADLOCKS))
                balance = (await session.execute(text(LOCK), {"id": payer})).scalar_one()
                await session.execute(text(LOCK), {"id": payee})
                if balance < amount:
                    raise InsufficientFunds(payer)
                await session.execute(text(MOVE), {"id": payee, "delta": amount})
                await session.execute(text(MOVE), {"id": payer, "delta": -amount})
            except Exception as error:
                ledger.saw(error)
                raise
            return payer, payee, amount

        return unit

    def sync_unit(session: Session) -> Transfer:
        try:
            session.execute(text(FAST_DEADLOCKS))
            balance = session.execute(text(LOCK), {"id": payer}).scalar_one()
            session.execute(text(LOCK), {"id": payee})
            if balance < amount:
                raise InsufficientFunds(payer)
            session.execute(text(MOVE), {"id": payee, "delta": amount})
            session.execute(text(MOVE), {"id": payer, "delta": -amount})
        except Exception as error:
            ledger.saw(error)
            raise
        return payer, payee, amount

    return sync_unit


def versioned_transfer(is_async: bool, payer: int, payee: int, amount: int, ledger: Ledger) -> Any:
    """transfer() with optimistic locking: the ORM's version_id_col makes a stale UPDATE match no row."""
    if is_async:

        async def unit(session: AsyncSession) -> Transfer:
            try:
                await session.execute(text(FAST_DEADLOCKS))
                source = await session.get_one(Account, payer)
                target = await session.get_one(Account, payee)
                if source.balance < amount:
                    raise InsufficientFunds(payer)
                target.balance += amount
                source.balance -= amount
                await session.flush()  # UPDATE ... WHERE id = :id AND version = :v
            except Exception as error:
                ledger.saw(error)
                raise
            return payer, payee, amount

        return unit

    def sync_unit(session: Session) -> Transfer:
        try:
            session.execute(text(FAST_DEADLOCKS))
            source = session.get_one(Account, payer)
            target = session.get_one(Account, payee)
            if source.balance < amount:
                raise InsufficientFunds(payer)
            target.balance += amount
            source.balance -= amount
            session.flush()
        except Exception as error:
            ledger.saw(error)
            raise
        return payer, payee, amount

    return sync_unit


def stale_or_transient(error: Exception) -> bool:
    """The default transient errors, plus the ORM's StaleDataError (a lost optimistic-locking race)."""
    return is_transient(error) or isinstance(error, StaleDataError)


CONTENTION_CASES = [
    ("semaphore", "asyncio", "locking", "REPEATABLE READ"),
    ("threads-psycopg", "asyncio", "locking", "REPEATABLE READ"),
    ("semaphore", "asyncio", "versioned", "READ COMMITTED"),
    ("threads-psycopg", "trio", "versioned", "READ COMMITTED"),
    ("semaphore", "asyncio", "versioned", "REPEATABLE READ"),
]
CONTENTION_IDS = [
    f"{kind}-{backend}-{variant}-{level.replace(' ', '_').lower()}"
    for kind, backend, variant, level in CONTENTION_CASES
]


@pytest.mark.anyio
@pytest.mark.usefixtures("accounts")
@pytest.mark.parametrize(
    ("kind", "anyio_backend", "variant", "isolation"), CONTENTION_CASES, ids=CONTENTION_IDS
)
async def test_transfers_under_contention_retry_to_exact_balances(
    kit: Kit, variant: str, isolation: str, admin: Engine, app_name: str
) -> None:
    """Transfers racing on 4 accounts hit 40001/40P01 (or StaleDataError); with retry the books balance."""
    # SELECT ... FOR UPDATE under REPEATABLE READ meets serialization failures (40001) and, locking
    # payer then payee, deadlocks (40P01): both transient by default. Optimistic versioning under READ
    # COMMITTED instead sees a concurrent change as an UPDATE that matched no row, which the ORM raises
    # as StaleDataError; that is not transient by default (it may be a real bug), so this policy names
    # it in retry_on. Under REPEATABLE READ the same race surfaces as 40001.
    is_async = kit.is_async
    policy = RetryPolicy(attempts=100, initial_delay=0.002, max_delay=0.05, retry_on=stale_or_transient)
    runner = kit.runner(limit=10, errors="collect", retry=policy, isolation_level=isolation)
    make = locking_transfer if variant == "locking" else versioned_transfer
    rng = random.Random(3)
    ledger = Ledger()
    plan = [(*rng.sample(range(ACCOUNTS), 2), rng.randint(1, 100)) for _ in range(TRANSFERS)]
    with anyio.fail_after(90):
        report = await runner.run(
            make(is_async, payer, payee, amount, ledger) for payer, payee, amount in plan
        )
    print(f"{variant}/{isolation}: retried={report.stats.retried} seen={dict(ledger.seen)}")
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after the transfers")
    # Only an overdraft may fail (and is rolled back); every transfer that ran is in the books.
    assert all(isinstance(o.error, InsufficientFunds) for o in report.failures), report.failures[:3]
    expected = [OPENING_BALANCE] * ACCOUNTS
    for outcome in report.outcomes:
        if outcome.ok:
            payer, payee, amount = outcome.unwrap()
            expected[payer] -= amount
            expected[payee] += amount
    with admin.connect() as connection:
        balances = [
            row.balance
            for row in connection.execute(text("SELECT id, balance FROM fault_accounts ORDER BY id"))
        ]
    assert sum(balances) == OPENING_BALANCE * ACCOUNTS
    assert balances == expected
    assert min(balances) >= 0
    assert report.stats.retried > 0
    assert report.stats.retried == sum(o.attempts - 1 for o in report.outcomes)
    if variant == "locking" or isolation != "READ COMMITTED":
        assert ledger.seen["40001"] + ledger.seen["40P01"] > 0
    else:
        assert ledger.seen["StaleDataError"] > 0


# -- 4. hang: a unit stuck on the server is stopped by timeout= ----------------------------------------------

HANG_CASES = [
    ("semaphore", "asyncio"),
    ("chunked", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg", "trio"),
    ("threads-psycopg2", "asyncio"),
]
HANG_IDS = [f"{kind}-{backend}" for kind, backend in HANG_CASES]


def hanging(kit: Kit) -> Any:
    """A unit that would sit in pg_sleep(60) on the server."""
    if kit.is_async:

        async def unit(session: AsyncSession) -> None:
            await session.execute(text("SELECT pg_sleep(60)"))

        return unit

    def sync_unit(session: Session) -> None:
        session.execute(text("SELECT pg_sleep(60)"))

    return sync_unit


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "anyio_backend"), HANG_CASES, ids=HANG_IDS)
async def test_a_hanging_unit_times_out_and_its_statement_stops_on_the_server(
    kit: Kit, admin: Engine, app_name: str
) -> None:
    """pg_sleep(60) with timeout=0.5: UnitTimeout fast, the query leaves the server, the slot is free."""
    runner = kit.runner(limit=1, timeout=0.5)
    started = time.monotonic()
    with anyio.fail_after(30), pytest.raises(UnitTimeout) as caught:
        await runner.submit(hanging(kit))
    elapsed = time.monotonic() - started
    assert elapsed < 5, f"UnitTimeout after {elapsed:.1f} s"
    assert caught.value.index == 0
    assert caught.value.timeout == 0.5
    if not kit.is_async:  # the server stopped it: statement_timeout's query_canceled is the cause
        assert codes_of(caught.value.__cause__) == "57014"
    wait_until(
        lambda: active_queries(admin, app_name, "%pg_sleep(60)%") == 0,
        10,
        "the timed-out pg_sleep(60) left pg_stat_activity",
    )
    assert runner.in_flight == 0
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after the timeout")
    # The slot is free: with limit=1 the next unit runs at once.
    with anyio.fail_after(5):
        assert await runner.submit(kit.select(7)) == 7
    # The same in a batch: the timeout is that unit's outcome, its neighbours commit.
    runner = kit.runner(limit=1, timeout=0.5, errors="collect")
    with anyio.fail_after(30):
        report = await runner.run([kit.select(1), hanging(kit), kit.select(3)])
    assert [o.ok for o in report.outcomes] == [True, False, True]
    assert isinstance(report.outcomes[1].error, UnitTimeout)
    assert not report.outcomes[1].commit_unknown
    assert kit.pool.checkedout() == 0


# -- 5. cancel: a run cancelled at a random point leaks nothing ----------------------------------------------

CANCEL_SEEDS = 200
CANCEL_CASES = [
    ("semaphore", "asyncio"),
    ("chunked", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg", "trio"),
]
CANCEL_IDS = [f"{kind}-{backend}" for kind, backend in CANCEL_CASES]


def small_unit(kit: Kit, seconds: float, started: Countdown, finished: Countdown) -> Any:
    """A unit that sleeps ``seconds`` on the server, reporting when it started and finished."""
    if kit.is_async:

        async def unit(session: AsyncSession) -> int:
            await session.execute(text("SELECT 1"))
            started.arrive()
            await session.execute(text("SELECT pg_sleep(CAST(:s AS float))"), {"s": seconds})
            finished.arrive()
            return 1

        return unit

    def sync_unit(session: Session) -> int:
        session.execute(text("SELECT 1"))
        started.arrive()
        session.execute(text("SELECT pg_sleep(CAST(:s AS float))"), {"s": seconds})
        finished.arrive()
        return 1

    return sync_unit


async def cancel_once(kit: Kit, runner: Any, seed: int) -> str:
    """Start a run (or a stream), cancel it at a point drawn from ``seed``; say where it was cancelled."""
    rng = random.Random(seed)
    n = rng.randint(1, 30)
    from_thread = not kit.is_async
    started = Countdown(rng.randint(1, min(n, runner.limit)), from_thread=from_thread)
    finished = Countdown(rng.randint(1, n), from_thread=from_thread)
    units = [small_unit(kit, rng.choice([0.0, 0.0, 0.001, 0.005]), started, finished) for _ in range(n)]
    verb = rng.choice(["run", "stream"])
    point = rng.choice(["checkpoints", "started", "finished"])

    async def work() -> None:
        if verb == "run":
            await runner.run(units)
        else:
            async with contextlib.aclosing(runner.stream(units)) as outcomes:
                async for _ in outcomes:
                    pass

    async with anyio.create_task_group() as group:
        group.start_soon(work)
        if point == "checkpoints":
            checkpoints = rng.randint(0, 300)
            for _ in range(checkpoints):
                await anyio.lowlevel.checkpoint()
            point = f"after {checkpoints} checkpoints"
        else:
            countdown = started if point == "started" else finished
            await countdown.event.wait()
            point = f"once {countdown.n} units had {point}"
        group.cancel_scope.cancel()
    return f"seed {seed}: {verb} of {n} units cancelled {point}"


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "anyio_backend"), CANCEL_CASES, ids=CANCEL_IDS)
async def test_cancelling_at_random_points_leaks_nothing(
    cancel_kit: FaultKit, admin: Engine, app_name: str
) -> None:
    """200 seeded cancellations of a run or stream: connections back, no open transaction, no warning."""
    kit = cancel_kit
    runner = kit.runner(limit=4)
    with anyio.fail_after(120), no_warnings():
        for seed in range(CANCEL_SEEDS):
            where = await cancel_once(kit, runner, seed)
            assert runner.in_flight == 0, where
            assert kit.pool.checkedout() == 0, where
            assert_no_open_transactions(admin, app_name, where)
        gc.collect()  # SQLAlchemy warns about connections it finds only in the garbage
    assert await runner.submit(kit.select(5)) == 5


class InjectedFailure(Exception):
    """Stands in for a COMMIT or ROLLBACK that failed on the client side (say, a cancel request hit it)."""


def fail_next(engine: Any, event_name: str) -> list[int]:
    """Make the engine's next ``commit``/``rollback`` raise before it reaches the server; count them."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    raised: list[int] = []

    def once(*_: Any) -> None:
        if not raised:
            raised.append(1)
            raise InjectedFailure(event_name)

    event.listen(sync_engine, event_name, once)
    return raised


SMALL_CASES = [("semaphore", "asyncio"), ("threads-psycopg", "asyncio")]
SMALL_IDS = [f"{kind}-{backend}" for kind, backend in SMALL_CASES]


@pytest.mark.anyio
@pytest.mark.usefixtures("reap_backends")
@pytest.mark.parametrize(("kind", "anyio_backend"), SMALL_CASES, ids=SMALL_IDS)
async def test_a_failed_commit_returns_a_clean_connection(kit: Kit, admin: Engine, app_name: str) -> None:
    """A COMMIT that fails before it reaches the server: the unit fails, its transaction does not linger."""
    # This is what a cancel request that lands just as COMMIT starts does for real (the test above
    # finds it now and then): the server aborts the transaction and keeps it open until a ROLLBACK.
    runner = kit.runner(limit=1, errors="collect")
    assert await runner.submit(kit.select(0)) == 0  # connect first: the dialect's set-up rolls back too
    raised = fail_next(kit.engine, "commit")
    report = await runner.run([kit.select(1)])
    assert raised == [1]
    assert isinstance(report.outcomes[0].error, InjectedFailure)
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after a failed COMMIT")
    # The next unit on the same (only) connection starts in a fresh transaction.
    assert await runner.submit(kit.select(2)) == 2


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "reap_backends")
@pytest.mark.parametrize(("kind", "anyio_backend"), SMALL_CASES, ids=SMALL_IDS)
async def test_a_failed_rollback_still_returns_the_connection(kit: Kit, admin: Engine, app_name: str) -> None:
    """If closing a unit's session fails (its ROLLBACK raised), the connection is still given back."""
    runner = kit.runner(limit=1, errors="collect")
    assert await runner.submit(kit.select(0)) == 0  # connect first: the dialect's set-up rolls back too
    raised = fail_next(kit.engine, "rollback")
    report = await runner.run([kit.insert(1, fail=True)])
    failed_with = type(report.outcomes[0].error)
    leaked = kit.pool.checkedout()
    del report  # its Boom's traceback holds the unit's frames, and so the unit's transaction
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()  # a connection dropped on the floor is closed only by GC, with a warning
    assert raised == [1]
    assert failed_with is Boom
    assert leaked == 0, "the unit's connection was neither returned to the pool nor invalidated"
    assert [str(warning.message) for warning in caught] == []
    assert_no_open_transactions(admin, app_name, "after a failed ROLLBACK")
    with anyio.fail_after(10):
        assert await runner.submit(kit.select(2)) == 2


# -- 6. Ctrl-C: run_sync interrupted by SIGINT ---------------------------------------------------------------

CHILD = """
import os
import sys
import threading

from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from boundeddb import ThreadOffloadRunner

LIMIT = 4
engine = create_engine(
    os.environ["BOUNDEDDB_CHILD_URL"],
    connect_args={"application_name": os.environ["BOUNDEDDB_CHILD_APP"]},
    pool_size=LIMIT,
    max_overflow=0,
)
runner = ThreadOffloadRunner(sessionmaker(engine), limit=LIMIT)
lock = threading.Lock()
arrived = 0


def unit(session):
    global arrived
    session.execute(text("SELECT 1"))
    with lock:
        arrived += 1
        if arrived == LIMIT:
            print("started", flush=True)
    session.execute(text("SELECT pg_sleep(30)"))


try:
    runner.run_sync([unit] * (2 * LIMIT))
except KeyboardInterrupt:
    print(f"interrupted checkedout={engine.pool.checkedout()}", flush=True)
    raise
print("finished without an interrupt", flush=True)
"""


def read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))


def next_line(lines: queue.Queue[str], timeout: float) -> str | None:
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def test_ctrl_c_stops_run_sync_promptly_and_leaves_no_backend(
    tmp_path: Path, admin: Engine, pg_url: Any
) -> None:
    """SIGINT during run_sync (4 units in pg_sleep(30)): KeyboardInterrupt fast, no backend left behind."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    app = f"bdbt-sigint-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "BOUNDEDDB_CHILD_URL": driver_url(pg_url, "psycopg").render_as_string(hide_password=False),
        "BOUNDEDDB_CHILD_APP": app,
        "PYTHONWARNINGS": "error",
    }
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=read_lines, args=(child.stdout, lines), daemon=True)
    reader.start()
    took = 0.0
    gone = False
    try:
        first = next_line(lines, 30)
        if first == "started":
            wait_until(lambda: active_queries(admin, app, "%pg_sleep(30)%") == 4, 10, "4 units in pg_sleep")
            interrupted = time.monotonic()
            child.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)
            took = time.monotonic() - interrupted
            # pg_sleep(30) does not notice a vanished client: only a real cancel stops it before 30 s.
            gone = child.poll() is not None and eventually(lambda: backends(admin, app) == 0, 10)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        reader.join(5)
        assert child.stdout is not None
        assert child.stderr is not None
        stderr = child.stderr.read()
        child.stdout.close()
        child.stderr.close()
        terminate_backends(admin, app)  # a killed child leaves its pg_sleep(30) running
    assert first == "started", f"the child did not start its units: {first!r}, {stderr[-2000:]}"
    assert child.returncode != -signal.SIGKILL, (
        f"the child was still running {took:.0f} s after SIGINT: the statements were not cancelled"
    )
    assert took < 5, f"the child took {took:.1f} s to exit after SIGINT"
    assert child.returncode == -signal.SIGINT, (child.returncode, stderr[-2000:])
    assert "KeyboardInterrupt" in stderr
    assert next_line(lines, 5) == "interrupted checkedout=0"
    assert gone, "10 s after the child exited, its backends were still there"


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "reap_backends")
@pytest.mark.parametrize(
    ("kind", "anyio_backend", "verb"),
    [
        ("semaphore", "asyncio", "run"),
        ("semaphore", "asyncio", "submit"),
        ("chunked", "asyncio", "run"),
        ("threads-psycopg", "asyncio", "run"),
        ("threads-psycopg", "asyncio", "submit"),
    ],
    ids=["semaphore-run", "semaphore-submit", "chunked-run", "threads-psycopg-run", "threads-psycopg-submit"],
)
async def test_a_native_asyncio_cancel_stops_units_promptly(
    kit: Kit, verb: str, admin: Engine, app_name: str
) -> None:
    """asyncio.timeout() (a plain Task.cancel(), as in run_sync's Ctrl-C) stops units in pg_sleep(30) fast."""
    # anyio cancel scopes reach every task of a run; a native cancellation reaches only the awaiting
    # task, which is what asyncio.timeout(), asyncio.wait_for(), servers and asyncio.Runner's SIGINT do.
    runner = kit.runner(limit=2)
    gate = StartGate(2 if verb == "run" else 1)
    units = [kit.sleep_then_insert(i, 30, gate) for i in range(4)]
    call = runner.run(units) if verb == "run" else runner.submit(units[0])
    task = asyncio.ensure_future(call)
    with anyio.fail_after(20):
        await gate.event.wait()
    await anyio.to_thread.run_sync(
        wait_until, lambda: active_queries(admin, app_name, "%pg_sleep%") >= 1, 10, "a unit in pg_sleep(30)"
    )
    cancelled_at = time.monotonic()
    task.cancel()
    with anyio.move_on_after(5):
        await asyncio.wait({task})
    took = time.monotonic() - cancelled_at
    finished = task.done()
    while not task.done():  # unblock the threads, so that the test itself ends
        terminate_backends(admin, app_name)
        with anyio.move_on_after(1):
            await asyncio.wait({task})
    assert finished, f"cancelled, the call still ran {took:.0f} s later: its units went on (pg_sleep(30))"
    assert task.cancelled()
    assert kit.pool.checkedout() == 0
    assert_no_open_transactions(admin, app_name, "after a native cancel")


# -- 7. bad units: ORM objects used after their session closed, units that end the transaction ---------------

BAD_UNIT_CASES = [
    ("semaphore", "asyncio"),
    ("chunked", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg", "trio"),
]
BAD_UNIT_IDS = [f"{kind}-{backend}" for kind, backend in BAD_UNIT_CASES]


@pytest.fixture
def family(admin: Engine) -> Iterator[int]:
    """A parent row with two children; yields the parent's id."""
    tables = fault_tables("fault_parents", "fault_children")
    FaultBase.metadata.drop_all(admin, tables=tables)
    FaultBase.metadata.create_all(admin, tables=tables)
    with admin.connect() as connection:
        connection.execute(insert(Parent), [{"id": 1, "name": "p"}])
        connection.execute(insert(Child), [{"id": 1, "parent_id": 1}, {"id": 2, "parent_id": 1}])
    yield 1
    FaultBase.metadata.drop_all(admin, tables=tables)


def loading_parent(is_async: bool, parent_id: int, *, eager: bool) -> Any:
    """A unit that returns the Parent ORM object, with its children lazy or loaded (selectinload)."""
    options = [selectinload(Parent.children)] if eager else []
    if is_async:

        async def unit(session: AsyncSession) -> Parent:
            return await session.get_one(Parent, parent_id, options=options)

        return unit

    def sync_unit(session: Session) -> Parent:
        return session.get_one(Parent, parent_id, options=options)

    return sync_unit


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "anyio_backend"), BAD_UNIT_CASES, ids=BAD_UNIT_IDS)
async def test_an_orm_object_returned_by_a_unit_is_detached(
    kit: FaultKit, family: int, admin: Engine, app_name: str
) -> None:
    """A returned ORM object is detached: lazy loads raise DetachedInstanceError; return plain values."""
    # The runner closes each unit's session when the unit ends, so whatever ORM object a unit returns
    # is detached by the time the caller sees it. With the default expire_on_commit=True even its
    # columns are expired, and any access raises DetachedInstanceError; a lazy relationship raises it
    # in any case. (On an AsyncSession that were still open, the lazy load would raise MissingGreenlet.)
    # Units should return plain values, or objects loaded eagerly (selectinload) from sessions made
    # with expire_on_commit=False.
    runner = kit.runner(limit=2)
    parent = await runner.submit(loading_parent(kit.is_async, family, eager=False))
    with pytest.raises(DetachedInstanceError, match="is not bound to a Session"):
        _ = parent.name
    with pytest.raises(DetachedInstanceError, match="is not bound to a Session"):
        _ = parent.children
    # The runner is unharmed.
    assert runner.in_flight == 0
    assert kit.pool.checkedout() == 0
    assert await runner.submit(kit.select(3)) == 3
    # The documented way: expire_on_commit=False and eager loading.
    maker: Any = async_sessionmaker if kit.is_async else sessionmaker
    engine = kit.engine
    options: dict[str, Any] = {"limit": 2}
    good = (
        SemaphoreRunner(maker(engine, expire_on_commit=False), **options)
        if kit.is_async
        else ThreadOffloadRunner(maker(engine, expire_on_commit=False), **options)
    )
    parent = await good.submit(loading_parent(kit.is_async, family, eager=True))
    assert parent.name == "p"
    assert sorted(child.id for child in parent.children) == [1, 2]
    assert_no_open_transactions(admin, app_name, "after returning ORM objects")


def ending_unit(is_async: bool, i: int, how: str) -> Any:
    """A unit that inserts row ``i`` and then ends the runner's transaction itself (``how``)."""
    if is_async:

        async def unit(session: AsyncSession) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            await getattr(session, how)()
            return i

        return unit

    def sync_unit(session: Session) -> int:
        session.add(Item(key=f"k{i}", unit=i))
        getattr(session, how)()
        return i

    return sync_unit


def slow_unit(is_async: bool, i: int, finished: set[int]) -> Any:
    """A unit that inserts row ``i``, sleeps 0.3 s on the server, and notes that it finished."""
    if is_async:

        async def unit(session: AsyncSession) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            await session.execute(text("SELECT pg_sleep(0.3)"))
            finished.add(i)
            return i

        return unit

    def sync_unit(session: Session) -> int:
        session.add(Item(key=f"k{i}", unit=i))
        session.execute(text("SELECT pg_sleep(0.3)"))
        finished.add(i)
        return i

    return sync_unit


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize("how", ["commit", "close"])
@pytest.mark.parametrize(("kind", "anyio_backend"), BAD_UNIT_CASES, ids=BAD_UNIT_IDS)
async def test_a_unit_that_ends_the_transaction_itself_is_misuse(
    kit: Kit, how: str, admin: Engine, app_name: str
) -> None:
    """errors="raise": session.commit()/close() in a unit: UnitMisuseError once the units in flight finish."""
    runner = kit.runner(limit=3)
    finished: set[int] = set()
    units = [
        slow_unit(kit.is_async, 0, finished),
        slow_unit(kit.is_async, 1, finished),
        ending_unit(kit.is_async, 2, how),
        *(kit.insert(i) for i in range(3, 10)),
    ]
    message = (
        r"^unit 2 ended the runner's transaction itself \(it called session\.commit\(\), rollback\(\) "
        r"or close\(\)\): .* remove the call \(use session\.flush\(\) to send changes early\)$"
    )
    with anyio.fail_after(30), pytest.raises(UnitMisuseError, match=message):
        await runner.run(units)
    assert finished == {0, 1}, "the units in flight finished before the error was raised"
    assert runner.in_flight == 0
    assert kit.pool.checkedout() == 0
    # Units 0 and 1 committed; what unit 2 committed itself stays; units 3.. never started.
    assert committed_units(admin) == ([0, 1, 2] if how == "commit" else [0, 1])
    assert_no_open_transactions(admin, app_name, f"after session.{how}() in a unit")
    # The runner is still usable.
    assert (await runner.run([kit.insert(20)])).values() == [20]


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize("how", ["commit", "close"])
@pytest.mark.parametrize(("kind", "anyio_backend"), BAD_UNIT_CASES, ids=BAD_UNIT_IDS)
async def test_a_unit_that_ends_the_transaction_itself_fails_alone_when_collecting(
    kit: Kit, how: str, admin: Engine, app_name: str
) -> None:
    """errors="collect": the misuse is unit 2's outcome; every other unit runs and commits; nothing raises."""
    runner = kit.runner(limit=3, errors="collect")
    finished: set[int] = set()
    units = [
        slow_unit(kit.is_async, 0, finished),
        slow_unit(kit.is_async, 1, finished),
        ending_unit(kit.is_async, 2, how),
        *(kit.insert(i) for i in range(3, 10)),
    ]
    with anyio.fail_after(30):
        report = await runner.run(units)
    assert [o.index for o in report.failures] == [2]
    assert isinstance(report.outcomes[2].error, UnitMisuseError)
    assert finished == {0, 1}
    assert runner.in_flight == 0
    assert kit.pool.checkedout() == 0
    assert committed_units(admin) == [i for i in range(10) if how == "commit" or i != 2]
    assert_no_open_transactions(admin, app_name, f"after session.{how}() in a unit")


# -- 8. load: 500 concurrent submit() callers; 100,000 units through stream() --------------------------------

#: How long the submit soak runs: the issue asks for 60 s; by default (CI) 10 s.
#: Run the full soak with BOUNDEDDB_SOAK_SECONDS=60.
SOAK_SECONDS = float(os.environ.get("BOUNDEDDB_SOAK_SECONDS", "10"))
CALLERS = 500


class Soak:
    """Mixed units for the soak: select, insert (own key), short server sleep, and a failing one."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self.keys = itertools.count(100_000)
        self.inserted = 0

    def unit(self, rng: random.Random) -> tuple[str, Any]:
        kind = rng.choices(["select", "insert", "sleep", "fail"], weights=[40, 30, 20, 10])[0]
        if kind == "select":
            return kind, self.kit.select(rng.randint(0, 1000))
        if kind == "insert":
            return kind, self.kit.insert(next(self.keys))
        if kind == "sleep":
            return kind, self.kit.insert(next(self.keys), sleep=0.002)
        return kind, self.kit.insert(next(self.keys), fail=True)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize(("kind", "anyio_backend"), SMALL_CASES, ids=SMALL_IDS)
async def test_500_submit_callers_soak_within_the_limit(
    kit: FaultKit, admin: Engine, app_name: str, sampler: ActivitySampler
) -> None:
    """500 callers submit mixed units for BOUNDEDDB_SOAK_SECONDS: every call answered, <= 10 connections."""
    limit = 10
    runner = kit.runner(limit=limit, pool_timeout=5)
    soak = Soak(kit)
    calls = collections.Counter[str]()
    answers = collections.Counter[str]()
    surprises: list[BaseException] = []
    deadline = time.monotonic() + SOAK_SECONDS

    async def caller(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            kind, unit = soak.unit(rng)
            calls[kind] += 1
            try:
                await runner.submit(unit)
            except Boom:
                assert kind == "fail"
            except Exception as error:  # a pool timeout, say: recorded, the soak goes on
                surprises.append(error)
                continue
            answers[kind] += 1

    with sampler, anyio.fail_after(SOAK_SECONDS + 60):
        async with anyio.create_task_group() as group:
            for seed in range(CALLERS):
                group.start_soon(caller, seed)
    print(f"soak {SOAK_SECONDS:.0f} s: {sum(calls.values())} calls {dict(calls)}, peak {sampler.peak}")
    assert surprises == []
    assert answers == calls
    assert sum(calls.values()) >= CALLERS
    assert sampler.samples > 0
    assert 1 <= sampler.peak <= limit
    assert runner.in_flight == 0
    assert kit.pool.checkedout() == 0
    assert len(committed_units(admin)) == calls["insert"] + calls["sleep"]
    assert_no_open_transactions(admin, app_name, "after the soak")


STREAM_UNITS = 100_000


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "anyio_backend"), [("semaphore", "asyncio")], ids=["semaphore-asyncio"])
async def test_100k_units_stream_with_bounded_lookahead(kit: Kit) -> None:
    """stream() over 100,000 units never pulls the generator more than ~3 * limit ahead of the consumer."""
    limit = 10
    runner = kit.runner(limit=limit)
    pulled = consumed = 0
    most_ahead = 0

    def trivial(i: int) -> Any:
        async def unit(session: AsyncSession) -> int:
            return i

        return unit

    def units() -> Iterator[Any]:
        nonlocal pulled, most_ahead
        for i in range(STREAM_UNITS):
            pulled += 1
            most_ahead = max(most_ahead, pulled - consumed)
            yield trivial(i)

    seen = 0
    with anyio.fail_after(120):
        async with contextlib.aclosing(runner.stream(units())) as outcomes:
            async for outcome in outcomes:
                assert outcome.ok
                consumed += 1
                seen += outcome.value + 1 if outcome.value is not None else 0
                if consumed % 1000 == 0:  # dawdle now and then, so the runner runs ahead if it can
                    for _ in range(100):
                        await anyio.lowlevel.checkpoint()
    assert consumed == STREAM_UNITS
    assert seen == STREAM_UNITS * (STREAM_UNITS + 1) // 2
    print(f"stream: most pulled ahead of the consumer = {most_ahead}")
    assert limit <= most_ahead <= 3 * limit, "the runner never ran ahead, or ran too far ahead"
