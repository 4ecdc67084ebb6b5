"""
The runners on MySQL/MariaDB: SemaphoreRunner and ChunkedRunner on aiomysql and asyncmy,
ThreadOffloadRunner on pymysql, against a real server.

The server is ``$BOUNDEDDB_TEST_MYSQL_URL`` (default: the local ``mysql://root@127.0.0.1:3306/test``);
where none answers, or the drivers are missing, the module is skipped with one reason (``.ci/run``
starts MariaDB and fails if it cannot).  Each statement a test sends carries a comment with the
test's own marker, so ``information_schema.processlist`` shows that test's statements and no others.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import (
    ChunkedRunner,
    RetryPolicy,
    SemaphoreRunner,
    ThreadOffloadRunner,
    UnitTimeout,
    is_transient,
)
from tests.conftest import PeakSampler
from tests.kits import eventually

pymysql = pytest.importorskip("pymysql", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")
pytest.importorskip("aiomysql", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")
pytest.importorskip("asyncmy", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")

DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"
SERVER = make_url(os.environ.get("BOUNDEDDB_TEST_MYSQL_URL", DEFAULT_URL)).set(drivername="mysql")


def _answers(url: URL) -> bool:
    try:
        pymysql.connect(
            host=url.host,
            port=url.port or 3306,
            user=url.username,
            password=url.password or "",
            connect_timeout=3,
        ).close()
    except Exception:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(
        not _answers(SERVER),
        reason=f"no MySQL/MariaDB server answers at {SERVER.render_as_string(hide_password=True)} "
        "(set BOUNDEDDB_TEST_MYSQL_URL; .ci/run starts the local MariaDB)",
    ),
    pytest.mark.usefixtures("collect_garbage"),
]

#: (runner kind, driver).  The async runners run on asyncio (the MySQL async drivers are asyncio's).
KINDS = [("semaphore", "aiomysql"), ("semaphore", "asyncmy"), ("chunked", "aiomysql"), ("threads", "pymysql")]
KIND_IDS = [f"{kind}-{driver}" for kind, driver in KINDS]
every_kind = pytest.mark.parametrize(
    ("kind", "driver", "anyio_backend"), [(*k, "asyncio") for k in KINDS], ids=KIND_IDS
)


@pytest.fixture
def admin() -> Iterator[Engine]:
    engine = create_engine(SERVER.set(drivername="mysql+pymysql"), isolation_level="AUTOCOMMIT", pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def marker() -> str:
    return f"bdbt{secrets.token_hex(4)}"


@pytest.fixture
def table(admin: Engine, marker: str) -> Iterator[str]:
    name = f"{marker}_items"
    with admin.connect() as c:
        columns = "id int AUTO_INCREMENT PRIMARY KEY, k varchar(64) UNIQUE NOT NULL, unit int"
        c.execute(text(f"CREATE TABLE {name} ({columns}) ENGINE=InnoDB"))
        c.execute(text(f"CREATE TABLE {marker}_lock (id int PRIMARY KEY, n int NOT NULL) ENGINE=InnoDB"))
        c.execute(text(f"INSERT INTO {marker}_lock VALUES (1, 0)"))
    yield name
    kill_marked(admin, marker)
    with admin.connect() as c:
        c.execute(text(f"DROP TABLE IF EXISTS {name}"))
        c.execute(text(f"DROP TABLE IF EXISTS {marker}_lock"))


@contextlib.contextmanager
def row_locked(admin: Engine, marker: str) -> Iterator[None]:
    """Hold the lock table's row in an open transaction: a unit's UPDATE of it waits (up to 50 s).

    Unlike SLEEP(), which MariaDB ends soon after the client goes away, a lock wait goes on
    whatever happens to the client: only a KILL QUERY (or the lock's release) ends it.
    """
    with admin.connect() as c:
        c.execute(text("SET SESSION autocommit = 0"))
        c.execute(text(f"SELECT n FROM {marker}_lock WHERE id = 1 FOR UPDATE"))
        try:
            yield
        finally:
            c.execute(text("ROLLBACK"))
            c.execute(text("SET SESSION autocommit = 1"))


def marked(admin: Engine, marker: str) -> list[tuple[int, str]]:
    """(id, statement) of every statement carrying ``marker`` the server is running."""
    with admin.connect() as c:
        rows = c.execute(
            text(
                "SELECT id, info FROM information_schema.processlist "
                "WHERE info LIKE :m AND id <> CONNECTION_ID()"
            ),
            {"m": f"%/* {marker} */%"},
        )
        return [(int(i), str(info)) for i, info in rows]


def kill_marked(admin: Engine, marker: str) -> None:
    for ident, _ in marked(admin, marker):
        with admin.connect() as c:
            c.execute(text(f"KILL {ident}"))


def rows(admin: Engine, table: str) -> list[int]:
    with admin.connect() as c:
        return sorted(c.execute(text(f"SELECT unit FROM {table}")).scalars())


class MyKit:
    """A runner of one kind on one MySQL driver, and units of the matching shape."""

    def __init__(self, kind: str, driver: str, table: str, marker: str) -> None:
        self.kind, self.driver, self.table, self.marker = kind, driver, table, marker
        self.is_async = kind != "threads"
        self.engine: Any = None

    def runner(self, limit: int = 4, **options: Any) -> Any:
        url = SERVER.set(drivername=f"mysql+{self.driver}")
        if self.is_async:
            self.engine = create_async_engine(url, pool_size=limit, max_overflow=0)
            sessions: Any = async_sessionmaker(self.engine)
            if self.kind == "chunked":
                return ChunkedRunner(sessions, chunk_size=limit, **options)
            return SemaphoreRunner(sessions, limit=limit, **options)
        self.engine = create_engine(url, pool_size=limit, max_overflow=0)
        return ThreadOffloadRunner(sessionmaker(self.engine), limit=limit, **options)

    @property
    def pool(self) -> Any:
        return self.engine.sync_engine.pool if self.is_async else self.engine.pool

    async def dispose(self) -> None:
        if self.engine is None:
            return
        if self.is_async:
            await self.engine.dispose()
        else:
            self.engine.dispose()

    def unit(
        self,
        i: int,
        *,
        sleep: float = 0.0,
        fail: bool = False,
        blocked: bool = False,
        after: Callable[[], None] | None = None,
    ) -> Any:
        """Insert row ``i``; then optionally sleep on the server or wait for the held row lock; fail."""
        insert = text(f"INSERT INTO {self.table} (k, unit) VALUES (:k, :u)")
        pause = text(f"SELECT /* {self.marker} */ SLEEP(:s)")
        wait = text(f"UPDATE /* {self.marker} */ {self.marker}_lock SET n = n + 1 WHERE id = 1")
        if self.is_async:

            async def unit(session: AsyncSession) -> int:
                await session.execute(insert, {"k": f"k{i}", "u": i})
                if after is not None:
                    after()
                if sleep:
                    await session.execute(pause, {"s": sleep})
                if blocked:
                    await session.execute(wait)
                if fail:
                    raise ValueError(i)
                return i

            return unit

        def sync_unit(session: Session) -> int:
            session.execute(insert, {"k": f"k{i}", "u": i})
            if after is not None:
                after()
            if sleep:
                session.execute(pause, {"s": sleep})
            if blocked:
                session.execute(wait)
            if fail:
                raise ValueError(i)
            return i

        return sync_unit


@pytest.fixture
async def kit(kind: str, driver: str, table: str, marker: str) -> Any:
    k = MyKit(kind, driver, table, marker)
    yield k
    await k.dispose()


@every_kind
@pytest.mark.anyio
async def test_the_bound_order_commits_and_failures(kit: MyKit, admin: Engine, marker: str) -> None:
    """40 units at limit 4: at most 4 statements and connections; order kept; a failure rolled back alone."""
    runner = kit.runner(limit=4, errors="collect")
    with PeakSampler(lambda: len(marked(admin, marker))) as sampler:
        report = await runner.run([kit.unit(i, sleep=0.05, fail=i == 7) for i in range(40)])
    assert [o.index for o in report.outcomes] == list(range(40))
    assert [o.value for o in report.outcomes if o.ok] == [i for i in range(40) if i != 7]
    assert isinstance(report.outcomes[7].error, ValueError)
    assert rows(admin, kit.table) == [i for i in range(40) if i != 7]
    assert 1 <= sampler.peak <= 4
    assert report.stats.peak_connections <= 4
    assert kit.pool.checkedout() == 0


@every_kind
@pytest.mark.anyio
async def test_input_is_pulled_lazily(kit: MyKit, admin: Engine) -> None:
    """A generator is pulled as slots free, never far ahead of the units in flight."""
    runner = kit.runner(limit=3)
    pulled = itertools.count()
    ahead: list[int] = []
    done = [0]

    def units() -> Iterator[Any]:
        for i in range(30):
            ahead.append(next(pulled) - done[0])
            yield kit.unit(i, after=lambda: done.__setitem__(0, done[0] + 1))

    report = await runner.run(units())
    assert len(report.outcomes) == 30
    assert max(ahead) <= 3 + 3  # the window (and, for chunks, the chunk being filled)
    assert rows(admin, kit.table) == list(range(30))


@every_kind
@pytest.mark.anyio
async def test_a_cancelled_run_leaves_nothing_running_nothing_half_written(
    kit: MyKit, admin: Engine, marker: str
) -> None:
    """Cancelled while 4 units wait on the server: their statements killed, nothing committed or leaked."""
    runner = kit.runner(limit=4)
    started = anyio.Event()
    count = [0]

    def arrived() -> None:
        count[0] += 1
        if count[0] == 4:
            (anyio.from_thread.run_sync(started.set) if not kit.is_async else started.set())

    with row_locked(admin, marker), anyio.fail_after(30):  # the lock wait alone would last 50 s
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, [kit.unit(i, blocked=True, after=arrived) for i in range(8)])
            await started.wait()
            assert eventually(lambda: len(marked(admin, marker)) == 4, 10)
            group.cancel_scope.cancel()
        assert kit.pool.checkedout() == 0
        # Killed on the server while the lock is still held: nothing else would end these waits.
        assert eventually(lambda: marked(admin, marker) == [], 10), marked(admin, marker)
    assert rows(admin, kit.table) == []  # each unit had inserted its row: all rolled back
    report = await runner.run([kit.unit(100 + i) for i in range(4)])  # the pool is usable again
    assert [o.value for o in report.outcomes] == [100, 101, 102, 103]


@every_kind
@pytest.mark.anyio
async def test_a_unit_over_its_timeout_is_rolled_back_and_stopped_on_the_server(
    kit: MyKit, admin: Engine, marker: str
) -> None:
    """timeout=0.5: UnitTimeout, its row rolled back, its neighbours committed; no statement left running."""
    runner = kit.runner(limit=2, errors="collect", timeout=0.5)
    if kit.is_async:
        with row_locked(admin, marker):  # the unit waits for the lock until the runner stops it
            report = await runner.run([kit.unit(0), kit.unit(1, blocked=True), kit.unit(2)])
            assert eventually(lambda: marked(admin, marker) == [], 10), marked(admin, marker)
    else:  # a thread cannot be interrupted on MySQL: its unit runs to its end (1 s), then times out
        report = await runner.run([kit.unit(0), kit.unit(1, sleep=1.0), kit.unit(2)])
    assert isinstance(report.outcomes[1].error, UnitTimeout)
    assert rows(admin, kit.table) == [0, 2]
    assert kit.pool.checkedout() == 0


@every_kind
@pytest.mark.anyio
async def test_a_killed_connection_is_retried(kit: MyKit, admin: Engine, marker: str) -> None:
    """KILL CONNECTION while a unit sleeps (a lost connection): retried in a new transaction, once."""
    runner = kit.runner(limit=2, errors="collect", retry=RetryPolicy(attempts=3, initial_delay=0.01))
    first = [True]

    def kill_once() -> None:
        if first[0]:
            first[0] = False
            threading.Thread(target=_kill_when_sleeping, args=(admin, marker), daemon=True).start()

    report = await runner.run([kit.unit(0, sleep=5, after=kill_once), kit.unit(1)])
    assert report.outcomes[0].ok, report.outcomes[0].error
    assert report.outcomes[0].attempts == 2
    assert rows(admin, kit.table) == [0, 1]


def _kill_when_sleeping(admin: Engine, marker: str) -> None:
    if eventually(lambda: len(marked(admin, marker)) == 1, 10):
        (ident, _), *_ = marked(admin, marker)
        with admin.connect() as c:
            c.execute(text(f"KILL CONNECTION {ident}"))


@every_kind
@pytest.mark.anyio
async def test_deadlocks_are_retried_and_the_balances_are_exact(
    kit: MyKit, admin: Engine, marker: str
) -> None:
    """Transfers both ways between 2 accounts (deadlocks, 1213): retried whole; each applied once."""
    accounts = f"{marker}_accounts"
    with admin.connect() as c:
        c.execute(text(f"CREATE TABLE {accounts} (id int PRIMARY KEY, balance int NOT NULL) ENGINE=InnoDB"))
        c.execute(text(f"INSERT INTO {accounts} VALUES (1, 1000), (2, 1000)"))
    try:
        lock = text(f"SELECT balance FROM {accounts} WHERE id = :a FOR UPDATE")
        move = text(f"UPDATE {accounts} SET balance = balance + :d WHERE id = :a")
        pause = text(f"SELECT /* {marker} */ SLEEP(0.02)")
        seen_transient: list[bool] = []

        def transfer(src: int, dst: int) -> Any:
            if kit.is_async:

                async def unit(session: AsyncSession) -> None:
                    await session.execute(lock, {"a": src})
                    await session.execute(pause)
                    await session.execute(lock, {"a": dst})
                    await session.execute(move, {"a": src, "d": -1})
                    await session.execute(move, {"a": dst, "d": 1})

                return unit

            def sync_unit(session: Session) -> None:
                session.execute(lock, {"a": src})
                session.execute(pause)
                session.execute(lock, {"a": dst})
                session.execute(move, {"a": src, "d": -1})
                session.execute(move, {"a": dst, "d": 1})

            return sync_unit

        def retry_on(error: BaseException) -> bool:
            seen_transient.append(True)
            return is_transient(error)

        policy = RetryPolicy(attempts=30, initial_delay=0.005, max_delay=0.05, retry_on=retry_on)
        runner = kit.runner(limit=4, errors="collect", retry=policy)
        # 30 transfers 1 -> 2 and 20 transfers 2 -> 1, interleaved: opposite lock orders deadlock.
        units = [transfer(1, 2) if i % 5 < 3 else transfer(2, 1) for i in range(50)]
        report = await runner.run(units)
        assert [o.error for o in report.outcomes if not o.ok] == []
        with admin.connect() as c:
            balances = dict(c.execute(text(f"SELECT id, balance FROM {accounts}")).all())
        assert balances == {1: 1000 - 30 + 20, 2: 1000 + 30 - 20}
        assert sum(o.attempts - 1 for o in report.outcomes) == len(seen_transient)
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP TABLE IF EXISTS {accounts}"))


def test_mysql_errors_are_classified() -> None:
    """Deadlock and lock wait timeout are transient; a lost connection (2013) is; a duplicate key is not."""
    from sqlalchemy import exc as sa_exc

    def wrapped(code: int, message: str) -> sa_exc.DBAPIError:
        return sa_exc.OperationalError("SELECT 1", {}, pymysql.err.OperationalError(code, message))

    assert is_transient(wrapped(1213, "Deadlock found when trying to get lock"))
    assert is_transient(wrapped(1205, "Lock wait timeout exceeded"))
    assert is_transient(wrapped(2013, "Lost connection to server during query"))
    assert not is_transient(
        sa_exc.IntegrityError("INSERT", {}, pymysql.err.IntegrityError(1062, "Duplicate entry"))
    )
