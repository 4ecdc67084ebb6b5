"""Misuse fails early and teaches: the right exception, a message naming the argument and the fix.

Construction is checked on SQLite engines that never connect; misuse of units on the real
PostgreSQL. Wherever the mistake can be seen up front, no connection may have been opened.
Messages are checked for the phrases that matter (the argument, the value, the fix), in order,
not word for word: the wording around them may improve.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool, Pool, StaticPool

from boundeddb import (
    AutoLimit,
    ChunkedRunner,
    RetryPolicy,
    RunnerClosedError,
    SemaphoreRunner,
    ThreadOffloadRunner,
    UnitMisuseError,
)
from tests.support.kits import Kit
from tests.support.models import Item
from tests.support.probes import committed_units, idle_in_transaction

RUNNERS = ["SemaphoreRunner", "ChunkedRunner", "ThreadOffloadRunner"]
ASYNC_RUNNERS = ["SemaphoreRunner", "ChunkedRunner"]
DEFAULT_LIMIT_RUNNERS = ["SemaphoreRunner", "ThreadOffloadRunner"]


def says(*phrases: str) -> str:
    """A pattern for pytest.raises(match=...): every phrase, in this order, anywhere in the message."""
    return "(?s)" + ".*".join(re.escape(phrase) for phrase in phrases)


def assert_untouched(pool: Pool) -> None:
    """No connection was ever opened: a fresh pool has none checked in and none checked out."""
    assert (pool.checkedin(), pool.checkedout()) == (0, 0)


# -- construction (SQLite engines that never connect) ------------------------------------------------


class Builder:
    """Makes a never-connected SQLite engine of the right kind for a runner, then the runner."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "never-opened.sqlite3"
        self.pool: Pool | None = None

    def sessions(self, runner: str, **pool: Any) -> Any:
        if runner == "ThreadOffloadRunner":
            engine = create_engine(f"sqlite:///{self.path}", **pool)
            self.pool = engine.pool
            return sessionmaker(engine)
        async_engine = create_async_engine(f"sqlite+aiosqlite:///{self.path}", **pool)
        self.pool = async_engine.sync_engine.pool
        return async_sessionmaker(async_engine)

    def runner(self, runner: str, *, pool: dict[str, Any] | None = None, **options: Any) -> Any:
        pool = {"pool_size": 5, "max_overflow": 10} if pool is None else pool
        if runner == "ChunkedRunner":
            options.setdefault("chunk_size", 5)  # its default of 40 is above this pool's capacity
        cls = {"SemaphoreRunner": SemaphoreRunner, "ChunkedRunner": ChunkedRunner}.get(
            runner, ThreadOffloadRunner
        )
        return cls(self.sessions(runner, **pool), **options)

    def assert_untouched(self) -> None:
        assert self.pool is not None
        assert_untouched(self.pool)


@pytest.fixture
def build(tmp_path: Path) -> Builder:
    return Builder(tmp_path)


def limit_name(runner: str) -> str:
    return "chunk_size" if runner == "ChunkedRunner" else "limit"


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("value", ["3", 2.5, True], ids=["str", "float", "bool"])
def test_limit_that_is_not_an_int_is_a_type_error(build: Builder, runner: str, value: object) -> None:
    """limit/chunk_size must be a real int (not a str, float or bool): TypeError naming it and the fix."""
    name = limit_name(runner)
    with pytest.raises(TypeError, match=says(f"{name} must be an int >= 1", f"got {value!r}", f"{name}=10")):
        build.runner(runner, **{name: value})
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("value", [0, -1])
def test_limit_below_one_is_a_value_error(build: Builder, runner: str, value: int) -> None:
    """limit/chunk_size of 0 or less is a ValueError naming it, the value and the fix."""
    name = limit_name(runner)
    with pytest.raises(ValueError, match=says(f"{name} must be >= 1", f"got {value}", f"{name}=10")):
        build.runner(runner, **{name: value})
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
def test_limit_above_the_pool_capacity_is_refused(build: Builder, runner: str) -> None:
    """A limit the pool cannot serve is refused, naming both numbers and both ways out."""
    name = limit_name(runner)
    message = says(
        f"{name}=20",
        "capacity is 15 (pool_size=5 + max_overflow=10)",
        f"{name}<=15",
        "pool_size + max_overflow >= 20",
    )
    with pytest.raises(ValueError, match=message):
        build.runner(runner, **{name: 20})
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
def test_limit_equal_to_the_pool_capacity_is_fine(build: Builder, runner: str) -> None:
    """The pool's whole capacity is a valid limit."""
    assert build.runner(runner, **{limit_name(runner): 15}).limit == 15
    build.assert_untouched()


@pytest.mark.parametrize("runner", DEFAULT_LIMIT_RUNNERS)
def test_limit_defaults_to_the_pool_capacity(build: Builder, runner: str) -> None:
    """Without a limit, a runner takes pool_size + max_overflow (5 + 10 here)."""
    assert build.runner(runner).limit == 15
    assert build.runner(runner, pool={"pool_size": 3, "max_overflow": 0}).limit == 3
    build.assert_untouched()


def test_chunked_runner_default_chunk_size_fits_the_default_pool(build: Builder) -> None:
    """ChunkedRunner(sessions) works on SQLAlchemy's default pool: 40, capped at the capacity (15)."""
    runner = ChunkedRunner(build.sessions("ChunkedRunner"))  # no pool arguments: 5 + 10
    assert runner.chunk_size == runner.limit == 15


@pytest.mark.parametrize("runner", DEFAULT_LIMIT_RUNNERS)
@pytest.mark.parametrize(
    ("pool", "pool_name"),
    [({"poolclass": NullPool}, "NullPool"), ({"max_overflow": -1}, "QueuePool")],
    ids=["NullPool", "unbounded-overflow"],
)
def test_a_pool_without_a_fixed_capacity_needs_an_explicit_limit(
    build: Builder, runner: str, pool: dict[str, Any], pool_name: str
) -> None:
    """NullPool (or unlimited overflow) gives no capacity to default to: ValueError asking for limit=N."""
    if runner != "ThreadOffloadRunner" and pool_name == "QueuePool":
        pool_name = "AsyncAdaptedQueuePool"
    message = says(f"{runner} needs an explicit limit", f"({pool_name}) has no fixed capacity", "limit=N")
    with pytest.raises(ValueError, match=message):
        build.runner(runner, pool=pool)


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_null_pool_with_an_explicit_limit_is_fine(build: Builder, runner: str) -> None:
    """With NullPool any positive limit goes: the database, not the pool, is the bound."""
    assert build.runner(runner, pool={"poolclass": NullPool}, **{limit_name(runner): 70}).limit == 70


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_static_pool_has_a_capacity_of_one(build: Builder, runner: str) -> None:
    """StaticPool shares one connection, so the limit is 1 by default and 2 is refused."""
    name = limit_name(runner)
    static = {"poolclass": StaticPool}
    assert build.runner(runner, pool=static, **{name: 1}).limit == 1
    if runner != "ChunkedRunner":
        assert build.runner(runner, pool=static).limit == 1
    with pytest.raises(ValueError, match=says(f"{name}=2", "capacity is 1")):
        build.runner(runner, pool=static, **{name: 2})


@pytest.mark.parametrize("runner", ASYNC_RUNNERS)
def test_an_async_runner_refuses_a_sync_sessionmaker(build: Builder, runner: str) -> None:
    """A sync sessionmaker given to an async runner: TypeError pointing at both fixes."""
    sessions = build.sessions("ThreadOffloadRunner")
    message = says(
        f"{runner} runs async units and needs an async_sessionmaker",
        "got a sync sessionmaker",
        "async_sessionmaker(create_async_engine(url))",
        "ThreadOffloadRunner",
    )
    cls = SemaphoreRunner if runner == "SemaphoreRunner" else ChunkedRunner
    with pytest.raises(TypeError, match=message):
        cls(sessions)
    build.assert_untouched()


def test_the_thread_runner_refuses_an_async_sessionmaker(build: Builder) -> None:
    """An async_sessionmaker given to ThreadOffloadRunner: TypeError pointing at both fixes."""
    sessions = build.sessions("SemaphoreRunner")
    message = says(
        "ThreadOffloadRunner runs sync units in threads and needs a sync sessionmaker",
        "got an async_sessionmaker",
        "sessionmaker(create_engine(url))",
        "SemaphoreRunner",
    )
    with pytest.raises(TypeError, match=message):
        ThreadOffloadRunner(sessions)
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
def test_something_that_is_not_a_sessionmaker_is_refused(build: Builder, runner: str) -> None:
    """Passing the engine itself (a common slip) or None is a TypeError saying what to pass."""
    engine = build.sessions(runner).kw["bind"]
    if runner == "ThreadOffloadRunner":
        wanted, fix = "sessions must be a sqlalchemy.orm.sessionmaker", "sessionmaker(create_engine(url))"
    else:
        wanted, fix = "sessions must be an async_sessionmaker", "async_sessionmaker(create_async_engine(url))"
    for wrong in (engine, None):
        message = says(wanted, type(wrong).__name__, fix)
        with pytest.raises(TypeError, match=message):
            _construct(runner, wrong)
    build.assert_untouched()


def _construct(runner: str, sessions: Any, **options: Any) -> Any:
    cls = {"SemaphoreRunner": SemaphoreRunner, "ChunkedRunner": ChunkedRunner}.get(
        runner, ThreadOffloadRunner
    )
    return cls(sessions, **options)


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_sessionmaker_without_a_bind_is_refused(runner: str) -> None:
    """The runner needs the engine to size itself: an unbound sessionmaker is a ValueError."""
    sessions = sessionmaker() if runner == "ThreadOffloadRunner" else async_sessionmaker()
    message = says("sessions must be bound to one engine", "bind=None", "sessionmaker(engine)")
    with pytest.raises(ValueError, match=message):
        _construct(runner, sessions)


@pytest.mark.parametrize("runner", RUNNERS)
def test_errors_must_be_raise_or_collect(build: Builder, runner: str) -> None:
    """errors="ignore" is refused with both valid choices explained."""
    with pytest.raises(ValueError, match=says("errors must be 'raise'", "'collect'", "got 'ignore'")):
        build.runner(runner, errors="ignore")
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")], ids=["0", "-1", "nan", "inf"])
def test_timeout_must_be_a_positive_number(build: Builder, runner: str, timeout: object) -> None:
    """timeout must be finite seconds > 0 or None; other numbers are a ValueError naming it."""
    message = says("timeout must be a finite number of seconds > 0", repr(timeout))
    with pytest.raises(ValueError, match=message):
        build.runner(runner, timeout=timeout)
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("timeout", ["1", True], ids=["str", "bool"])
def test_timeout_must_be_a_number(build: Builder, runner: str, timeout: object) -> None:
    """A timeout that is not a number is a TypeError (as for limit), naming it and the fix."""
    message = says("timeout must be a number of seconds", repr(timeout), "timeout=5")
    with pytest.raises(TypeError, match=message):
        build.runner(runner, timeout=timeout)
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("retry", [3, RetryPolicy], ids=["int", "the-class"])
def test_retry_must_be_a_retry_policy(build: Builder, runner: str, retry: object) -> None:
    """retry=3 (or the class itself) is a TypeError showing how to build a policy."""
    message = says("retry must be a boundeddb.RetryPolicy", repr(retry), "retry=RetryPolicy(attempts=3)")
    with pytest.raises(TypeError, match=message):
        build.runner(runner, retry=retry)
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("reserve", ["1", 1.0, True], ids=["str", "float", "bool"])
def test_reserve_must_be_an_int(build: Builder, runner: str, reserve: object) -> None:
    """reserve="1" is a TypeError naming it and what it is for."""
    message = says("reserve must be an int >= 0", repr(reserve), "priority > 0", "reserve=1")
    with pytest.raises(TypeError, match=message):
        build.runner(runner, reserve=reserve)
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_negative_reserve_is_a_value_error(build: Builder, runner: str) -> None:
    """reserve=-1 is a ValueError naming it, the value and the fix."""
    with pytest.raises(ValueError, match=says("reserve must be >= 0", "-1", "reserve=1")):
        build.runner(runner, reserve=-1)
    build.assert_untouched()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("reserve", [5, 6])
def test_a_reserve_as_large_as_the_limit_is_refused(build: Builder, runner: str, reserve: int) -> None:
    """reserve >= limit would leave priority-0 work no slot: a ValueError naming both numbers."""
    name = limit_name(runner)
    message = says(f"reserve={reserve} must be less than {name}=5", "reserve <= 4", f"larger {name}")
    with pytest.raises(ValueError, match=message):
        build.runner(runner, **{name: 5}, reserve=reserve)
    assert build.runner(runner, **{name: 5}, reserve=4).statistics().reserve == 4
    build.assert_untouched()


@pytest.mark.parametrize("runner", DEFAULT_LIMIT_RUNNERS)
def test_an_auto_limit_needs_room_for_its_reserve(build: Builder, runner: str) -> None:
    """With limit="auto" the reserve sits on top of what moves: min_limit + reserve must fit the ceiling."""
    message = says("reserve=4", "min_limit=2", "ceiling of 5", "reserve <= 3", "larger max_limit")
    with pytest.raises(ValueError, match=message):
        build.runner(runner, limit=AutoLimit(min_limit=2, max_limit=5), reserve=4)
    runner_ = build.runner(runner, limit=AutoLimit(min_limit=2, max_limit=5), reserve=3)
    assert (runner_.limit, runner_.statistics().reserve) == (5, 3)  # initial 4 + 3, within the ceiling
    build.assert_untouched()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("priority", ["1", 1.5, True, None], ids=["str", "float", "bool", "None"])
async def test_priority_must_be_an_int(build: Builder, runner: str, priority: object) -> None:
    """Every verb refuses priority="1" before it touches the database, naming it and the fix."""
    message = says("priority must be an int", repr(priority), "priority=1")
    instance = build.runner(runner)

    async def unit(session: Any) -> None:  # never called
        raise AssertionError

    with pytest.raises(TypeError, match=message):
        await instance.run([unit], priority=priority)
    with pytest.raises(TypeError, match=message):
        await instance.map(unit, [1], priority=priority)
    with pytest.raises(TypeError, match=message):
        instance.stream([unit], priority=priority)
    with pytest.raises(TypeError, match=message):
        await instance.submit(unit, priority=priority)
    build.assert_untouched()


def test_run_sync_checks_its_priority(build: Builder) -> None:
    """run_sync(priority="1") is refused as the async verbs refuse it."""
    with pytest.raises(TypeError, match=says("priority must be an int", "'1'", "priority=1")):
        build.runner("ThreadOffloadRunner").run_sync([], priority="1")
    build.assert_untouched()


# -- units and verbs (the real PostgreSQL) -----------------------------------------------------------

KINDS = [("semaphore", "asyncio"), ("chunked", "asyncio"), ("threads-psycopg", "asyncio")]
KIND_IDS = [kind for kind, _ in KINDS]
ASYNC_KINDS = KINDS[:2]
ASYNC_KIND_IDS = KIND_IDS[:2]
THREADS = [("threads-psycopg", "asyncio"), ("threads-psycopg", "trio")]
THREAD_IDS = ["threads-asyncio", "threads-trio"]

every_kind = pytest.mark.parametrize(("kind", "anyio_backend"), KINDS, ids=KIND_IDS)
async_kinds = pytest.mark.parametrize(("kind", "anyio_backend"), ASYNC_KINDS, ids=ASYNC_KIND_IDS)
threads = pytest.mark.parametrize(("kind", "anyio_backend"), THREADS, ids=THREAD_IDS)


def unit_example(kit: Kit) -> str:
    return "async def unit(session): ..." if kit.is_async else "def unit(session): ..."


def not_callable(kit: Kit, index: int, what: object) -> str:
    """The pattern of the message for unit ``index``, which is ``what`` and not callable."""
    return says(f"unit {index} is {what!r}", "not callable", unit_example(kit))


def ended_transaction(index: int) -> str:
    """The pattern of the message for unit ``index``, which committed, rolled back or closed its session."""
    return says(f"unit {index} ended the runner's transaction itself", "remove the call", "session.flush()")


@pytest.mark.parametrize("errors", ["raise", "collect"])
@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_a_non_callable_unit_in_a_list_is_refused_before_any_database_work(
    kit: Kit, admin: Engine, errors: str
) -> None:
    """A list is checked up front: UnitMisuseError naming the unit's index, and no connection opened."""
    runner = kit.runner(limit=2, errors=errors)
    with pytest.raises(UnitMisuseError, match=not_callable(kit, 2, 42)):
        await runner.run([kit.insert(0), kit.insert(1), 42])
    with pytest.raises(UnitMisuseError, match=not_callable(kit, 1, None)):
        async for _ in runner.stream((kit.insert(0), None)):
            pass  # pragma: no cover - refused before the first outcome
    assert_untouched(kit.pool)
    assert committed_units(admin) == []


@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_a_non_callable_unit_from_a_generator_stops_a_raising_run_after_the_units_in_flight(
    kit: Kit, admin: Engine, app_name: str
) -> None:
    """errors="raise": a generator's units are checked as pulled; earlier ones commit, later never start."""
    runner = kit.runner(limit=2)

    with pytest.raises(UnitMisuseError, match=not_callable(kit, 2, "unit two")):
        await runner.run(units_with_a_string(kit))
    assert committed_units(admin) == [0, 1]
    assert kit.pool.checkedout() == 0
    assert idle_in_transaction(admin, app_name) == 0


@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_a_non_callable_unit_from_a_generator_is_its_own_outcome_when_collecting(
    kit: Kit, admin: Engine
) -> None:
    """errors="collect": the refused unit's outcome carries the UnitMisuseError; every other unit runs."""
    report = await kit.runner(limit=2, errors="collect").run(units_with_a_string(kit))
    refused = report.outcomes[2]
    assert isinstance(refused.error, UnitMisuseError)
    assert re.search(not_callable(kit, 2, "unit two"), str(refused.error))
    assert refused.attempts == 0, "it never ran"
    assert [o.ok for o in report.outcomes] == [True, True, False, True]
    assert committed_units(admin) == [0, 1, 3]
    assert (report.stats.submitted, report.stats.failed) == (4, 1)


def units_with_a_string(kit: Kit) -> Iterator[Any]:
    yield kit.insert(0)
    yield kit.insert(1)
    yield "unit two"
    yield kit.insert(3)


@threads
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_the_thread_runner_refuses_async_units_up_front(kit: Kit, admin: Engine) -> None:
    """Async units, map fns or callables given to ThreadOffloadRunner: named, SemaphoreRunner advised."""

    async def coroutine_unit(session: AsyncSession) -> int:  # pragma: no cover - never called
        return 1

    async def coroutine_fn(session: AsyncSession, item: int) -> int:  # pragma: no cover - never called
        return item

    class AsyncCallable:
        async def __call__(self, session: AsyncSession) -> int:  # pragma: no cover - never called
            return 1

    def message(index: int) -> str:
        return says(f"unit {index} is an async function", "ThreadOffloadRunner", "SemaphoreRunner")

    runner = kit.runner(limit=2, errors="collect")
    with pytest.raises(UnitMisuseError, match=message(1)):
        await runner.run([kit.insert(0), coroutine_unit])
    with pytest.raises(UnitMisuseError, match=message(2)):
        await runner.run([kit.insert(0), kit.insert(1), AsyncCallable()])
    with pytest.raises(UnitMisuseError, match=message(0)):
        await runner.map(coroutine_fn, range(3))
    with pytest.raises(UnitMisuseError, match=message(0)):
        await runner.submit(coroutine_unit)
    assert_untouched(kit.pool)
    assert committed_units(admin) == []


@threads
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_the_thread_runner_refuses_a_unit_that_returns_a_coroutine(kit: Kit, admin: Engine) -> None:
    """A plain callable that returns a coroutine is caught when it returns; its row is rolled back."""

    async def later() -> int:  # pragma: no cover - closed unawaited, without a warning
        return 1

    def sneaky(session: Session) -> Any:
        session.add(Item(key="sneaky", unit=1))
        session.flush()
        return later()

    message = says("unit 1 returned an awaitable", "def unit(session: Session)", "SemaphoreRunner")
    with pytest.raises(UnitMisuseError, match=message):
        await kit.runner(limit=1).run([kit.insert(0), sneaky, kit.insert(2)])
    assert committed_units(admin) == [0], "errors='raise': unit 2 never started"
    assert kit.pool.checkedout() == 0
    report = await kit.runner(limit=1, errors="collect").run([kit.insert(10), sneaky, kit.insert(12)])
    assert isinstance(report.outcomes[1].error, UnitMisuseError)
    assert re.search(message, str(report.outcomes[1].error))
    assert committed_units(admin) == [0, 10, 12], "errors='collect': the others run; sneaky's row is gone"
    assert kit.pool.checkedout() == 0


@async_kinds
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_an_async_runner_refuses_a_plain_function_unit(kit: Kit, admin: Engine) -> None:
    """A plain def unit given to an async runner: UnitMisuseError naming it and ThreadOffloadRunner."""

    def plain(session: Any) -> int:
        return 1

    runner = kit.runner(limit=1)
    name = type(runner).__name__

    def message(index: int) -> str:
        return says(f"unit {index} returned int, not an awaitable", name, "ThreadOffloadRunner")

    with pytest.raises(UnitMisuseError, match=message(1)):
        await runner.run([kit.insert(0), plain, kit.insert(2)])
    assert committed_units(admin) == [0], "unit 0 committed; unit 2 never started"
    with pytest.raises(UnitMisuseError, match=message(0)):
        await runner.submit(plain)
    report = await kit.runner(limit=1, errors="collect").run([kit.insert(10), plain, kit.insert(12)])
    assert re.search(message(1), str(report.outcomes[1].error))
    assert committed_units(admin) == [0, 10, 12], "errors='collect': the other units run"
    assert kit.pool.checkedout() == 0


def ending_unit(kit: Kit, i: int, how: str) -> Callable[[Any], Any]:
    """A unit that inserts row ``i`` and then ends the runner's transaction itself."""
    if kit.is_async:

        async def unit(session: AsyncSession) -> int:
            session.add(Item(key=f"k{i}", unit=i))
            await session.flush()
            await getattr(session, how)()
            return i

        return unit

    def sync_unit(session: Session) -> int:
        session.add(Item(key=f"k{i}", unit=i))
        session.flush()
        getattr(session, how)()
        return i

    return sync_unit


@pytest.mark.parametrize("how", ["commit", "rollback", "close"])
@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_a_unit_that_ends_the_transaction_itself_stops_a_raising_run(
    kit: Kit, admin: Engine, app_name: str, how: str
) -> None:
    """errors="raise": session.commit()/rollback()/close() inside a unit raises UnitMisuseError."""
    runner = kit.runner(limit=1)
    with pytest.raises(UnitMisuseError, match=ended_transaction(1)):
        await runner.run([kit.insert(0), ending_unit(kit, 1, how), kit.insert(2)])
    # As the message says, what the unit committed itself stays committed; unit 2 never started.
    assert committed_units(admin) == ([0, 1] if how == "commit" else [0])
    with pytest.raises(UnitMisuseError, match=ended_transaction(0)):
        await runner.submit(ending_unit(kit, 5, how))
    assert kit.pool.checkedout() == 0
    assert idle_in_transaction(admin, app_name) == 0


@pytest.mark.parametrize("how", ["commit", "rollback", "close"])
@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
async def test_a_unit_that_ends_the_transaction_itself_is_its_own_outcome_when_collecting(
    kit: Kit, admin: Engine, app_name: str, how: str
) -> None:
    """errors="collect": that unit's outcome carries UnitMisuseError; the batch goes on; nothing raises."""
    runner = kit.runner(limit=1, errors="collect")
    report = await runner.run([kit.insert(0), ending_unit(kit, 1, how), kit.insert(2)])
    [misuse] = report.failures
    assert misuse.index == 1
    assert isinstance(misuse.error, UnitMisuseError)
    assert re.search(ended_transaction(1), str(misuse.error))
    assert committed_units(admin) == ([0, 1, 2] if how == "commit" else [0, 2])
    with pytest.raises(UnitMisuseError, match=ended_transaction(0)):
        await runner.submit(ending_unit(kit, 5, how))  # submit raises the unit's failure, as always
    assert kit.pool.checkedout() == 0
    assert idle_in_transaction(admin, app_name) == 0


@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
async def test_units_that_are_not_iterable_are_refused(kit: Kit) -> None:
    """run(42), run("abc") and stream(42) are TypeErrors saying what to pass, before any database work."""
    runner = kit.runner(limit=2)

    def message(value: object) -> str:
        return says("units must be an iterable", f"got {type(value).__name__}", "a list or a generator")

    for wrong in (42, "abc", b"abc", None):
        with pytest.raises(TypeError, match=message(wrong)):
            await runner.run(wrong)
    with pytest.raises(TypeError, match=message(42)):
        async for _ in runner.stream(42):
            pass  # pragma: no cover - refused before the first outcome
    assert_untouched(kit.pool)


@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
async def test_map_refuses_a_non_callable_fn_and_non_iterable_items(kit: Kit) -> None:
    """map(fn=42, ...) and map(fn, items=42) are TypeErrors naming the argument, before any database work."""
    runner = kit.runner(limit=2)
    name = type(runner).__name__
    with pytest.raises(TypeError, match=says("fn must be callable", "got 42", f"{name}.map()")):
        await runner.map(fn=42, items=[1, 2])
    items_message = says("items must be an iterable", "got int", f"{name}.map(fn, items)")
    with pytest.raises(TypeError, match=items_message):
        await runner.map(kit.map_fn(), 42)
    assert_untouched(kit.pool)


@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
async def test_submit_refuses_a_non_callable_before_any_database_work(kit: Kit) -> None:
    """submit(42) is a TypeError (UnitMisuseError) saying what a unit looks like."""
    runner = kit.runner(limit=2)
    with pytest.raises(TypeError, match=not_callable(kit, 0, 42)) as caught:
        await runner.submit(42)
    assert isinstance(caught.value, UnitMisuseError)
    assert_untouched(kit.pool)


async def use(runner: Any, kit: Kit, verb: str) -> None:
    """Give the runner one unit of work through ``verb``."""
    if verb == "run":
        await runner.run([kit.select(1)])
    elif verb == "map":
        await runner.map(kit.map_fn(), [1])
    elif verb == "stream":
        async for _ in runner.stream([kit.select(1)]):
            pass  # pragma: no cover - refused before the first outcome
    else:
        await runner.submit(kit.select(1))


@pytest.mark.parametrize("verb", ["run", "map", "submit"])
@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_closed_runner_refuses_work(kit: Kit, verb: str) -> None:
    """After aclose() or `async with`, run/map/submit raise RunnerClosedError, with no database work."""
    runner = kit.runner(limit=2)
    async with runner:
        pass
    message = says(f"this {type(runner).__name__} is closed", "create a new runner")
    with pytest.raises(RunnerClosedError, match=message):
        await use(runner, kit, verb)
    assert_untouched(kit.pool)
    assert repr(runner).endswith(" closed>")


@every_kind
@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_closed_runner_refuses_a_stream_without_leaking_it(kit: Kit) -> None:
    """stream() on a closed runner raises RunnerClosedError and leaves nothing unclosed behind."""
    # Known bug: BaseRunner._stream_units (_runners/base.py) opens its memory object streams before
    # `with self._bound()` refuses the call, and never closes them: their __del__ emits a
    # ResourceWarning (an error in this suite). The same happens on RunnerBusyElsewhereError.
    runner = kit.runner(limit=2)
    await runner.aclose()
    message = says(f"this {type(runner).__name__} is closed", "create a new runner")
    with pytest.raises(RunnerClosedError, match=message):
        await use(runner, kit, "stream")
    assert_untouched(kit.pool)


@pytest.mark.postgres
def test_a_closed_thread_runner_refuses_run_sync(make_sync_engine: Any) -> None:
    """run_sync() after close() (or leaving `with`) raises RunnerClosedError, before any database work."""
    engine: Engine = make_sync_engine("psycopg", pool_size=2)
    with ThreadOffloadRunner(sessionmaker(engine)) as runner:
        pass
    message = says("this ThreadOffloadRunner is closed", "create a new runner")
    with pytest.raises(RunnerClosedError, match=message):
        runner.run_sync([lambda session: 1])
    assert_untouched(engine.pool)


@threads
@pytest.mark.postgres
@pytest.mark.anyio
async def test_run_sync_from_async_code_says_to_await_run(kit: Kit) -> None:
    """run_sync() inside an event loop would block it: RuntimeError naming `await runner.run(units)`."""
    runner = kit.runner(limit=2)
    message = says("run_sync() was called from async code", "await runner.run(units)")
    with pytest.raises(RuntimeError, match=message):
        runner.run_sync([kit.select(1)])
    assert_untouched(kit.pool)
    # It is the event loop that matters, not the thread: from a worker thread run_sync is fine.
    report = await anyio.to_thread.run_sync(runner.run_sync, [kit.select(7)])
    assert report.values() == [7]
