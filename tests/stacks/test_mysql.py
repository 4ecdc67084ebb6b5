"""
What only MySQL/MariaDB needs on top of the contract (tests/runners/test_contract.py and
tests/runners/test_cancellation.py run on MariaDB too): statements stopped on the server with KILL QUERY,
killed connections, deadlocks and lock wait timeouts, MySQL's error numbers.

Each test runs on a database of its own (tests/support/servers.py) on ``$BOUNDEDDB_TEST_MYSQL_URL`` (default:
the local ``mysql://root@127.0.0.1:3306/test``); where no server answers, or the drivers are missing,
the tests are skipped with one reason (``.ci/run`` starts MariaDB and fails if it cannot).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from boundeddb import RetryPolicy, UnitTimeout, is_transient
from tests.support.kits import MYSQL_CASES, MYSQL_IDS, Kit, eventually
from tests.support.models import Item
from tests.support.servers import MariaDB, mysql_row_locked

pytestmark = [pytest.mark.mysql, pytest.mark.usefixtures("collect_garbage")]

every_kind = pytest.mark.parametrize(("kind", "anyio_backend"), MYSQL_CASES, ids=MYSQL_IDS)

#: The statement of a unit that waits for the row lock ``row_locked()`` holds.
WAIT_FOR_LOCK = "UPDATE locks SET n = n + 1 WHERE id = 1"


@pytest.fixture
def locks(mysql_db: MariaDB) -> None:
    """A one-row ``locks`` table in the test's database, for units to wait on."""
    with mysql_db.admin.connect() as c:
        c.execute(text(f"CREATE TABLE `{mysql_db.database}`.locks (id int PRIMARY KEY, n int NOT NULL)"))
        c.execute(text(f"INSERT INTO `{mysql_db.database}`.locks VALUES (1, 0)"))


def row_locked(db: MariaDB) -> contextlib.AbstractContextManager[None]:
    """
    Hold the ``locks`` row in an open transaction: a unit's UPDATE of it waits (up to 50 s). The
    admin connection has no current database, so it is not one of the test's connections.
    """
    return mysql_row_locked(db.admin, f"`{db.database}`.locks")


def unit(
    kit: Kit,
    i: int,
    *,
    sleep: Callable[[], float] = lambda: 0.0,
    blocked: bool = False,
    after: Callable[[], None] | None = None,
) -> Any:
    """Insert row ``i``; call ``after``; then sleep ``sleep()`` s on the server, or wait for the lock."""
    pause = text(kit.db.sleep)
    wait = text(WAIT_FOR_LOCK)
    if kit.is_async:

        async def async_unit(session: AsyncSession) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            await session.flush()
            if after is not None:
                after()
            if seconds := sleep():
                await session.execute(pause, {"s": seconds})
            if blocked:
                await session.execute(wait)
            return i

        return async_unit

    def sync_unit(session: Session) -> int:
        session.add(Item(key=f"k{i}", unit=i))
        session.flush()
        if after is not None:
            after()
        if seconds := sleep():
            session.execute(pause, {"s": seconds})
        if blocked:
            session.execute(wait)
        return i

    return sync_unit


def lock_waits(kit: Kit) -> list[tuple[int, str]]:
    """The test's statements waiting for the held row lock."""
    return kit.db.statements("UPDATE locks%")


@every_kind
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "locks")
async def test_a_cancelled_run_kills_its_statements_on_the_server(kit: Kit) -> None:
    """Cancelled while 4 units wait for a row lock: their statements killed, nothing committed or leaked."""
    runner = kit.runner(limit=4)
    started = anyio.Event()
    count = [0]

    def arrived() -> None:
        count[0] += 1
        if count[0] == 4:
            (anyio.from_thread.run_sync(started.set) if not kit.is_async else started.set())

    assert isinstance(kit.db, MariaDB)
    with row_locked(kit.db), anyio.fail_after(30):  # the lock wait alone would last 50 s
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, [unit(kit, i, blocked=True, after=arrived) for i in range(8)])
            await started.wait()
            assert eventually(lambda: len(lock_waits(kit)) == 4, 10)
            group.cancel_scope.cancel()
        assert kit.pool.checkedout() == 0
        # Killed on the server while the lock is still held: nothing else would end these waits.
        assert eventually(lambda: lock_waits(kit) == [], 10), lock_waits(kit)
    assert kit.db.committed_units() == []  # each unit had inserted its row: all rolled back
    kit.db.assert_no_open_transactions("after the cancelled run")
    report = await runner.run([unit(kit, 100 + i) for i in range(4)])  # the pool is usable again
    assert [o.value for o in report.outcomes] == [100, 101, 102, 103]


@every_kind
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "locks")
async def test_a_unit_over_its_timeout_is_rolled_back_and_stopped_on_the_server(kit: Kit) -> None:
    """timeout=0.5: UnitTimeout, its row rolled back, its neighbours committed; no statement left running."""
    runner = kit.runner(limit=2, errors="collect", timeout=0.5)
    assert isinstance(kit.db, MariaDB)
    # The unit waits for the lock until the runner stops it (a thread's, by a KILL QUERY from the
    # runner's deadlines thread): the run ends while the lock is still held, 50 s before the wait would.
    with row_locked(kit.db), anyio.fail_after(30):
        report = await runner.run([unit(kit, 0), unit(kit, 1, blocked=True), unit(kit, 2)])
        assert eventually(lambda: lock_waits(kit) == [], 10), lock_waits(kit)
    assert isinstance(report.outcomes[1].error, UnitTimeout)
    assert kit.db.committed_units() == [0, 2]
    assert kit.pool.checkedout() == 0
    kit.db.assert_no_open_transactions("after the timeout")


@every_kind
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_a_killed_connection_is_retried(kit: Kit) -> None:
    """KILL CONNECTION while a unit sleeps (a lost connection): retried in a new transaction, once."""
    runner = kit.runner(limit=2, errors="collect", retry=RetryPolicy(attempts=3, initial_delay=0.01))
    first = [True]

    def kill_once() -> None:
        if first[0]:
            threading.Thread(target=_kill_when_sleeping, args=(kit,), daemon=True).start()

    def sleep_once() -> float:  # the first attempt sleeps until it is killed, the retry not at all
        seconds = 30.0 if first[0] else 0.0
        first[0] = False
        return seconds

    with anyio.fail_after(20):
        report = await runner.run([unit(kit, 0, sleep=sleep_once, after=kill_once), unit(kit, 1)])
    assert report.outcomes[0].ok, report.outcomes[0].error
    assert report.outcomes[0].attempts == 2
    assert kit.db.committed_units() == [0, 1]


def _kill_when_sleeping(kit: Kit) -> None:
    if eventually(lambda: kit.db.sleeping() == 1, 10):
        (ident, _), *_ = kit.db.statements(kit.db.sleep_like)
        with kit.db.admin.connect() as c:
            c.execute(text(f"KILL CONNECTION {ident}"))


@every_kind
@pytest.mark.anyio
async def test_deadlocks_are_retried_and_the_balances_are_exact(kit: Kit, mysql_db: MariaDB) -> None:
    """Transfers both ways between 2 accounts (deadlocks, 1213): retried whole; each applied once."""
    accounts = f"`{mysql_db.database}`.accounts"
    with mysql_db.admin.connect() as c:
        c.execute(text(f"CREATE TABLE {accounts} (id int PRIMARY KEY, balance int NOT NULL) ENGINE=InnoDB"))
        c.execute(text(f"INSERT INTO {accounts} VALUES (1, 1000), (2, 1000)"))
    lock = text("SELECT balance FROM accounts WHERE id = :a FOR UPDATE")
    move = text("UPDATE accounts SET balance = balance + :d WHERE id = :a")
    pause = text("SELECT SLEEP(0.02)")
    seen_transient: list[bool] = []

    def transfer(src: int, dst: int) -> Any:
        if kit.is_async:

            async def async_unit(session: AsyncSession) -> None:
                await session.execute(lock, {"a": src})
                await session.execute(pause)
                await session.execute(lock, {"a": dst})
                await session.execute(move, {"a": src, "d": -1})
                await session.execute(move, {"a": dst, "d": 1})

            return async_unit

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
    with mysql_db.admin.connect() as c:
        balances = dict(c.execute(text(f"SELECT id, balance FROM {accounts}")).all())
    assert balances == {1: 1000 - 30 + 20, 2: 1000 + 30 - 20}
    assert sum(o.attempts - 1 for o in report.outcomes) == len(seen_transient)
    assert len(seen_transient) > 0, "no deadlock happened: the test did not test retries"


@every_kind
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "locks")
async def test_a_lock_wait_timeout_is_retried_in_a_new_transaction(kit: Kit, mysql_db: MariaDB) -> None:
    """A 1205 (which rolls back only its statement) retries the whole unit: its row is written once."""
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(mysql_db, held, release), daemon=True)
    holder.start()
    assert held.wait(10)
    errors: list[BaseException] = []

    def retry_on(error: BaseException) -> bool:
        errors.append(error)
        release.set()  # the retry finds the row free
        return is_transient(error)

    runner = kit.runner(limit=2, errors="collect", retry=RetryPolicy(attempts=3, retry_on=retry_on))
    short_wait = text("SET SESSION innodb_lock_wait_timeout = 1")
    if kit.is_async:

        async def async_unit(session: AsyncSession) -> int:
            await session.execute(short_wait)
            session.add(Item(key="k0", unit=0))
            await session.flush()
            await session.execute(text(WAIT_FOR_LOCK))
            return 0

        units: list[Any] = [async_unit]
    else:

        def sync_unit(session: Session) -> int:
            session.execute(short_wait)
            session.add(Item(key="k0", unit=0))
            session.flush()
            session.execute(text(WAIT_FOR_LOCK))
            return 0

        units = [sync_unit]
    try:
        with anyio.fail_after(30):
            report = await runner.run(units)
    finally:
        release.set()
        holder.join(10)
    assert [getattr(getattr(e, "orig", None), "args", (None,))[0] for e in errors] == [1205]
    assert report.outcomes[0].ok, report.outcomes[0].error
    assert report.outcomes[0].attempts == 2
    assert kit.db.committed_units() == [0]  # the first attempt's row was rolled back with it


def _hold_lock(db: MariaDB, held: threading.Event, release: threading.Event) -> None:
    with row_locked(db):
        held.set()
        release.wait(30)


def test_mysql_errors_are_classified() -> None:
    """Deadlock and lock wait timeout are transient; a lost connection (2013) is; a duplicate key is not."""
    pymysql = pytest.importorskip(
        "pymysql", reason="the MySQL drivers are in the test extra (boundeddb[mysql])"
    )
    from sqlalchemy import exc as sa_exc

    def wrapped(code: int, message: str) -> sa_exc.DBAPIError:
        return sa_exc.OperationalError("SELECT 1", {}, pymysql.err.OperationalError(code, message))

    assert is_transient(wrapped(1213, "Deadlock found when trying to get lock"))
    assert is_transient(wrapped(1205, "Lock wait timeout exceeded"))
    assert is_transient(wrapped(2013, "Lost connection to server during query"))
    assert not is_transient(
        sa_exc.IntegrityError("INSERT", {}, pymysql.err.IntegrityError(1062, "Duplicate entry"))
    )


#: Rows of the transaction whose rollback keeps a killed connection on the server for a while.
ROLLBACK_ROWS = 1_000_000


def test_a_connection_discarded_while_another_one_rolls_back_is_ended_at_once(mysql_db: MariaDB) -> None:
    """
    The ender's wait for a connection whose rollback is long never holds back the next one: a sleeping
    connection handed in meanwhile is killed and gone while the first still rolls back.
    """
    import pymysql

    from boundeddb._dialects.enders import Enders
    from boundeddb._dialects.mysql import end_connections

    url = mysql_db.url("pymysql")
    options = {"host": url.host, "port": url.port or 3306, "user": url.username}
    options["database"] = mysql_db.database
    big, sleeper = pymysql.connect(**options), pymysql.connect(**options)
    with big.cursor() as cursor:
        cursor.execute("CREATE TABLE rollback_rows (id INT PRIMARY KEY, pad CHAR(100)) ENGINE=InnoDB")
        cursor.execute("BEGIN")
        cursor.execute(f"INSERT INTO rollback_rows SELECT seq, 'x' FROM seq_1_to_{ROLLBACK_ROWS}")
    sleeping = threading.Thread(target=_sleep_until_killed, args=(sleeper,), daemon=True)
    sleeping.start()
    big_id, sleeper_id = big.thread_id(), sleeper.thread_id()
    assert eventually(lambda: sleeper_id in {i for i, _ in mysql_db.statements("%SLEEP(%")}, 10)

    enders: Enders[int] = Enders("test-mysql-end", end_connections)
    enders.end_soon(url, big_id)
    assert eventually(lambda: _command(mysql_db, big_id) == "Killed", 10), "rolling back"
    enders.end_soon(url, sleeper_id)
    assert eventually(lambda: _command(mysql_db, sleeper_id) is None, 1.0), "killed at once"
    assert _command(mysql_db, big_id) == "Killed", f"{ROLLBACK_ROWS:,} rows still rolling back: set-up held"
    enders.wait(url, timeout=30)
    assert _command(mysql_db, big_id) is None
    sleeping.join(10)
    with mysql_db.admin.begin() as connection:
        connection.execute(text(f"DROP TABLE `{mysql_db.database}`.rollback_rows"))


def _sleep_until_killed(connection: Any) -> None:
    with contextlib.suppress(Exception), connection.cursor() as cursor:
        cursor.execute("SELECT SLEEP(60)")


def _command(mysql_db: MariaDB, ident: int) -> str | None:
    """The server's ``command`` of connection ``ident``, or None once it is gone."""
    with mysql_db.admin.connect() as connection:
        row = connection.execute(
            text("SELECT command FROM information_schema.processlist WHERE id = :id"), {"id": ident}
        ).first()
    return None if row is None else str(row[0])
