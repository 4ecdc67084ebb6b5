"""Bad units: ORM objects used after their session closed, units that end the transaction themselves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from sqlalchemy import insert, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, selectinload, sessionmaker
from sqlalchemy.orm.exc import DetachedInstanceError

from boundeddb import SemaphoreRunner, ThreadOffloadRunner, UnitMisuseError
from tests.support.faults import Child, FaultBase, Parent, assert_no_open_transactions, fault_tables
from tests.support.kits import Kit
from tests.support.models import Item
from tests.support.probes import committed_units

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


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
    kit: Kit, family: int, admin: Engine, app_name: str
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
