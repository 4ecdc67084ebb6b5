"""
ThreadOffloadRunner on mysqlclient (``mysql+mysqldb``, MySQL's C driver) against a real MySQL/MariaDB.

mysqlclient builds from source against the MySQL or MariaDB client library (``libmariadb-dev`` and
``pkg-config`` on Debian), so it is not in the test extra: ``noxfile.py`` installs it where that
library is found, and this module is skipped, with one reason, where it is not installed.  The server
is ``$BOUNDEDDB_TEST_MYSQL_URL`` (default: the local ``mysql://root@127.0.0.1:3306/test``), as for
``tests/stacks/test_mysql.py``; each statement a test sends carries the test's own marker, so
``information_schema.processlist`` shows that test's statements and no others.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import RetryPolicy, ThreadOffloadRunner, UnitTimeout, is_transient
from tests.support.kits import eventually
from tests.support.probes import PeakSampler
from tests.support.servers import mysql_row_locked

MySQLdb = pytest.importorskip(
    "MySQLdb",
    reason="mysqlclient is not installed (it builds against libmariadb-dev and pkg-config; "
    "noxfile.py installs it where they are found)",
)

pytestmark = [
    pytest.mark.mysql,
    pytest.mark.usefixtures("collect_garbage"),
]


@pytest.fixture
def admin(mysql_server: URL) -> Iterator[Engine]:
    engine = create_engine(
        mysql_server.set(drivername="mysql+pymysql"), isolation_level="AUTOCOMMIT", pool_size=2
    )
    yield engine
    engine.dispose()


@pytest.fixture
def marker() -> str:
    return f"bdbc{secrets.token_hex(4)}"


@pytest.fixture
def table(admin: Engine, marker: str) -> Iterator[str]:
    name = f"{marker}_items"
    with admin.connect() as c:
        columns = "id int AUTO_INCREMENT PRIMARY KEY, k varchar(64) UNIQUE NOT NULL, unit int"
        c.execute(text(f"CREATE TABLE {name} ({columns}) ENGINE=InnoDB"))
        c.execute(text(f"CREATE TABLE {marker}_lock (id int PRIMARY KEY, n int NOT NULL) ENGINE=InnoDB"))
        c.execute(text(f"INSERT INTO {marker}_lock VALUES (1, 0)"))
    yield name
    for ident, _ in marked(admin, marker):
        with admin.connect() as c, contextlib.suppress(Exception):
            c.execute(text(f"KILL {ident}"))
    with admin.connect() as c:
        c.execute(text(f"DROP TABLE IF EXISTS {name}"))
        c.execute(text(f"DROP TABLE IF EXISTS {marker}_lock"))


@pytest.fixture
def engine(mysql_server: URL) -> Iterator[Engine]:
    made = create_engine(mysql_server.set(drivername="mysql+mysqldb"), pool_size=4, max_overflow=0)
    yield made
    made.dispose()


def row_locked(admin: Engine, marker: str) -> contextlib.AbstractContextManager[None]:
    """Hold the lock table's row in an open transaction: a unit's UPDATE of it waits (up to 50 s)."""
    return mysql_row_locked(admin, f"{marker}_lock")


def marked(admin: Engine, marker: str) -> list[tuple[int, str]]:
    """(id, statement) of every statement carrying ``marker`` the server is running."""
    with admin.connect() as c:
        found = c.execute(
            text(
                "SELECT id, info FROM information_schema.processlist "
                "WHERE info LIKE :m AND id <> CONNECTION_ID()"
            ),
            {"m": f"%/* {marker} */%"},
        )
        return [(int(i), str(info)) for i, info in found]


def rows(admin: Engine, table: str) -> list[int]:
    with admin.connect() as c:
        return sorted(c.execute(text(f"SELECT unit FROM {table}")).scalars())


def unit(
    table: str,
    marker: str,
    i: int,
    *,
    sleep: float = 0.0,
    fail: bool = False,
    blocked: bool = False,
    after: Callable[[], None] | None = None,
) -> Callable[[Session], int]:
    """Insert row ``i``; then optionally sleep on the server or wait for the held row lock; fail."""

    def insert(session: Session) -> int:
        session.execute(text(f"INSERT INTO {table} (k, unit) VALUES (:k, :u)"), {"k": f"k{i}", "u": i})
        if after is not None:
            after()
        if sleep:
            session.execute(text(f"SELECT /* {marker} */ SLEEP(:s)"), {"s": sleep})
        if blocked:
            session.execute(text(f"UPDATE /* {marker} */ {marker}_lock SET n = n + 1 WHERE id = 1"))
        if fail:
            raise ValueError(i)
        return i

    return insert


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_bound_order_commits_and_failures(
    engine: Engine, admin: Engine, table: str, marker: str
) -> None:
    """40 units at limit 4: at most 4 statements at once; order kept; a failure rolled back alone."""
    runner = ThreadOffloadRunner(sessionmaker(engine), limit=4, errors="collect")
    units = [unit(table, marker, i, sleep=0.05, fail=i == 7) for i in range(40)]
    with PeakSampler(lambda: len(marked(admin, marker))) as sampler:
        report = await runner.run(units)
    assert [o.index for o in report.outcomes] == list(range(40))
    assert [o.value for o in report.outcomes if o.ok] == [i for i in range(40) if i != 7]
    assert isinstance(report.outcomes[7].error, ValueError)
    assert rows(admin, table) == [i for i in range(40) if i != 7]
    assert 1 <= sampler.peak <= 4
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_cancelled_run_kills_its_statements(
    engine: Engine, admin: Engine, table: str, marker: str
) -> None:
    """Cancelled while 4 units wait for a row lock: killed on the server while mysqlclient is busy."""
    runner = ThreadOffloadRunner(sessionmaker(engine), limit=4)
    started = anyio.Event()
    count = [0]
    lock = threading.Lock()

    def arrived() -> None:
        with lock:
            count[0] += 1
            if count[0] == 4:
                anyio.from_thread.run_sync(started.set)

    units = [unit(table, marker, i, blocked=True, after=arrived) for i in range(8)]
    with row_locked(admin, marker), anyio.fail_after(30):  # the lock wait alone would last 50 s
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, units)
            await started.wait()
            assert eventually(lambda: len(marked(admin, marker)) == 4, 10)
            group.cancel_scope.cancel()
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        # Killed while the lock is still held: nothing else would end these waits.
        assert eventually(lambda: marked(admin, marker) == [], 10), marked(admin, marker)
    assert rows(admin, table) == []
    report = await runner.run([unit(table, marker, 100 + i) for i in range(4)])  # the pool works again
    assert [o.value for o in report.outcomes] == [100, 101, 102, 103]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_unit_over_its_timeout_is_rolled_back(
    engine: Engine, admin: Engine, table: str, marker: str
) -> None:
    """timeout=0.5 on a unit in SLEEP(30): the runner's KILL QUERY stops it; rolled back, UnitTimeout."""
    runner = ThreadOffloadRunner(sessionmaker(engine), limit=2, errors="collect", timeout=0.5)
    with anyio.fail_after(20):
        report = await runner.run(
            [unit(table, marker, 0), unit(table, marker, 1, sleep=30.0), unit(table, marker, 2)]
        )
    assert isinstance(report.outcomes[1].error, UnitTimeout)
    assert rows(admin, table) == [0, 2]
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_killed_connection_is_retried(engine: Engine, admin: Engine, table: str, marker: str) -> None:
    """KILL CONNECTION while a unit sleeps (a lost connection): retried in a new transaction, once."""
    runner = ThreadOffloadRunner(
        sessionmaker(engine), limit=2, errors="collect", retry=RetryPolicy(attempts=3, initial_delay=0.01)
    )
    first = [True]

    def kill_when_sleeping() -> None:
        if eventually(lambda: len(marked(admin, marker)) == 1, 10):
            (ident, _), *_ = marked(admin, marker)
            with admin.connect() as c:
                c.execute(text(f"KILL CONNECTION {ident}"))

    def kill_once() -> None:
        if first[0]:
            first[0] = False
            threading.Thread(target=kill_when_sleeping, daemon=True).start()

    report = await runner.run([unit(table, marker, 0, sleep=5, after=kill_once), unit(table, marker, 1)])
    assert report.outcomes[0].ok, report.outcomes[0].error
    assert report.outcomes[0].attempts == 2
    assert rows(admin, table) == [0, 1]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_deadlocks_are_retried_and_the_balances_are_exact(
    engine: Engine, admin: Engine, marker: str
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

        def transfer(src: int, dst: int) -> Callable[[Session], None]:
            def move_one(session: Session) -> None:
                session.execute(lock, {"a": src})
                session.execute(pause)
                session.execute(lock, {"a": dst})
                session.execute(move, {"a": src, "d": -1})
                session.execute(move, {"a": dst, "d": 1})

            return move_one

        policy = RetryPolicy(attempts=30, initial_delay=0.005, max_delay=0.05)
        runner = ThreadOffloadRunner(sessionmaker(engine), limit=4, errors="collect", retry=policy)
        report = await runner.run([transfer(1, 2) if i % 5 < 3 else transfer(2, 1) for i in range(50)])
        assert [o.error for o in report.outcomes if not o.ok] == []
        with admin.connect() as c:
            balances = dict(c.execute(text(f"SELECT id, balance FROM {accounts}")).all())
        assert balances == {1: 1000 - 30 + 20, 2: 1000 + 30 - 20}
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP TABLE IF EXISTS {accounts}"))


def test_mysqlclient_errors_are_classified() -> None:
    """mysqlclient's deadlock, lock wait timeout and lost connection are transient; a duplicate key is not."""

    def wrapped(error: Any) -> sa_exc.DBAPIError:
        return sa_exc.DBAPIError.instance("SELECT 1", {}, error, MySQLdb.Error)

    assert is_transient(wrapped(MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock")))
    assert is_transient(wrapped(MySQLdb.OperationalError(1205, "Lock wait timeout exceeded")))
    assert is_transient(wrapped(MySQLdb.OperationalError(2013, "Lost connection to server during query")))
    assert not is_transient(wrapped(MySQLdb.IntegrityError(1062, "Duplicate entry")))


def test_mysqlclient_refuses_thread_id_while_another_thread_runs_a_statement(
    mysql_server: URL, admin: Engine, marker: str
) -> None:
    """Why the runner reads a connection's id when it is made: asked while busy, mysqlclient raises."""
    server = mysql_server
    conn = MySQLdb.connect(
        host=server.host, port=server.port or 3306, user=server.username, password=server.password or ""
    )
    busy = threading.Thread(target=lambda: conn.cursor().execute(f"SELECT /* {marker} */ SLEEP(1)"))
    busy.start()
    try:
        assert eventually(lambda: len(marked(admin, marker)) == 1, 10)
        with pytest.raises(MySQLdb.ProgrammingError, match="already in use from another thread"):
            conn.thread_id()
    finally:
        busy.join()
        conn.close()
