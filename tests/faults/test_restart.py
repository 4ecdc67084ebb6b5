"""A server restart: a private PostgreSQL stopped (-m fast) and started again mid-run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from boundeddb import RetryPolicy, SemaphoreRunner, ThreadOffloadRunner
from boundeddb.testing import driver_url
from tests.support.faults import (
    ConnectAttempts,
    PrivateServer,
    Progress,
    assert_no_open_transactions,
    check_commit_invariant,
    inserting,
    is_refused,
    unexpected_failures,
)
from tests.support.models import Base

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


RESTART_UNITS = 1000


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """An embedded PostgreSQL of this test's own: the shared server must never be restarted."""
    server = PrivateServer()
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
