"""
A fleet behind a real PgBouncer in transaction mode: 4 processes x limit 5 over a server pool of 5.

Each process has its own engine (with :func:`boundeddb.pgbouncer_engine_options`) and runner and
writes a unique key per unit.  The server's connections are counted in ``pg_stat_activity`` on a
direct connection: PgBouncer gives each server connection the application_name of the client it
serves, the test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks.db.pgbouncer import PgBouncer, pgbouncer_binary
from sqlalchemy import text
from sqlalchemy.engine import Engine

from boundeddb import pgbouncer_engine_options
from boundeddb.testing import PostgresServer
from tests.support.faults import wait_until
from tests.support.ports import free_port
from tests.support.probes import ActivitySampler, terminate_backends

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        pgbouncer_binary() is None,
        reason="pgbouncer is not installed (.ci/run installs it: apt-get install pgbouncer)",
    ),
]

POOL = 5
LIMIT = 5
#: (runner, driver) of the fleet's four processes.
FLEET = (("semaphore", "asyncpg"), ("semaphore", "psycopg"), ("threads", "psycopg"), ("threads", "psycopg2"))

WORKER = """
import asyncio, json, sys
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from boundeddb import RetryPolicy, SemaphoreRunner, ThreadOffloadRunner, pgbouncer_engine_options

runner_kind, url, schema, prefix, n, app, retry, limit = sys.argv[1:]
n, limit = int(n), int(limit)
options = pgbouncer_engine_options(url)
args = options.setdefault("connect_args", {})
if "+asyncpg" in url:
    args["server_settings"] = {"application_name": app}
else:
    args["application_name"] = app
policy = RetryPolicy(attempts=20, initial_delay=0.05, max_delay=0.5) if retry == "1" else None
insert = text(f"INSERT INTO {schema}.fleet (key) VALUES (:key)")
read = text("SELECT CAST(:i AS int) + 1")


def keyed(i):
    key = f"{prefix}-{i}"
    if runner_kind == "semaphore":
        async def unit(session):
            await session.execute(read, {"i": i})
            await session.execute(insert, {"key": key})
            return key
    else:
        def unit(session):
            session.execute(read, {"i": i})
            session.execute(insert, {"key": key})
            return key
    return unit


units = [keyed(i) for i in range(n)]
if runner_kind == "semaphore":
    async def main():
        engine = create_async_engine(url, pool_size=limit, max_overflow=0, **options)
        try:
            sessions = async_sessionmaker(engine)
            async with SemaphoreRunner(sessions, limit=limit, errors="collect", retry=policy) as r:
                return await r.run(units)
        finally:
            await engine.dispose()
    report = asyncio.run(main())
else:
    engine = create_engine(url, pool_size=limit, max_overflow=0, **options)
    with ThreadOffloadRunner(sessionmaker(engine), limit=limit, errors="collect", retry=policy) as r:
        report = r.run_sync(units)
    engine.dispose()
print(json.dumps({
    "succeeded": [o.value for o in report.outcomes if o.ok],
    "unknown": [f"{prefix}-{o.index}" for o in report.outcomes if o.commit_unknown],
    "failed": [f"{type(o.error).__name__}: {o.error}"[:300] for o in report.outcomes
               if o.error is not None and not o.commit_unknown],
    "retried": sum(o.attempts - 1 for o in report.outcomes),
}))
"""


@pytest.fixture
def bouncer(pg_server: PostgresServer) -> Iterator[PgBouncer]:
    with PgBouncer(pg_server.url, pool_size=POOL, port=free_port()) as b:
        yield b


@pytest.fixture
def fleet_table(admin: Engine, pg_schema: str, app_name: str) -> Iterator[str]:
    with admin.connect() as c:
        c.execute(text(f"DROP TABLE IF EXISTS {pg_schema}.fleet"))
        c.execute(text(f"CREATE TABLE {pg_schema}.fleet (id serial PRIMARY KEY, key text UNIQUE NOT NULL)"))
    yield pg_schema
    terminate_backends(admin, app_name)
    with admin.connect() as c:
        c.execute(text(f"DROP TABLE IF EXISTS {pg_schema}.fleet"))


def rows(admin: Engine, schema: str) -> int:
    with admin.connect() as c:
        return int(c.execute(text(f"SELECT count(*) FROM {schema}.fleet")).scalar_one())


def keys(admin: Engine, schema: str) -> set[str]:
    with admin.connect() as c:
        return set(c.execute(text(f"SELECT key FROM {schema}.fleet")).scalars())


def start_fleet(
    tmp_path: Path, bouncer: PgBouncer, schema: str, app: str, n: int, *, retry: bool
) -> list[Any]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    procs = []
    for k, (runner, driver) in enumerate(FLEET):
        url = bouncer.url(driver).render_as_string(hide_password=False)
        argv = [sys.executable, str(script), runner, url, schema, f"p{k}", str(n), app, "1" if retry else "0"]
        procs.append(
            subprocess.Popen(
                [*argv, str(LIMIT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
        )
    return procs


def finish_fleet(procs: list[Any], timeout: float = 240) -> list[dict[str, Any]]:
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"a fleet process hung: {err[-3000:]}")
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_pgbouncer_engine_options_refuses_an_unknown_driver() -> None:
    with pytest.raises(ValueError, match=r"pgbouncer_engine_options\(url\).*'sqlite'.*postgresql\+asyncpg"):
        pgbouncer_engine_options("sqlite:///x.db")
    with pytest.raises(ValueError, match="'postgresql\\+pg8000'"):
        pgbouncer_engine_options("postgresql+pg8000://u@h/db")


def test_pgbouncer_engine_options_per_driver() -> None:
    asyncpg = pgbouncer_engine_options("postgresql+asyncpg://u@h/db")["connect_args"]
    assert asyncpg["statement_cache_size"] == 0
    assert asyncpg["prepared_statement_cache_size"] == 0
    names = {asyncpg["prepared_statement_name_func"]() for _ in range(100)}
    assert len(names) == 100  # unique across clients: no "already exists" on a shared server connection
    assert pgbouncer_engine_options("postgresql+psycopg://u@h/db") == {
        "connect_args": {"prepare_threshold": None}
    }
    assert (
        pgbouncer_engine_options("postgresql+psycopg_async://u@h/db")["connect_args"]["prepare_threshold"]
        is None
    )
    assert pgbouncer_engine_options("postgresql+psycopg2://u@h/db") == {}
    first = pgbouncer_engine_options("postgresql+psycopg://u@h/db")
    first["connect_args"]["x"] = 1
    assert (
        "x" not in pgbouncer_engine_options("postgresql+psycopg://u@h/db")["connect_args"]
    )  # a new dict each call


def test_without_the_options_asyncpg_fails_behind_the_pooler(bouncer: PgBouncer) -> None:
    """The fixture is a real transaction-mode pooler: asyncpg's default prepared statements break there."""
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> str | None:
        engine = create_async_engine(bouncer.url("asyncpg"), pool_size=5, max_overflow=0)
        try:

            async def one(i: int) -> None:
                # Many short transactions per client connection: a statement asyncpg prepared in one
                # lands, in the next transaction, on whichever server connection the pooler hands out.
                for _ in range(20):
                    async with engine.begin() as c:
                        await c.execute(text("SELECT CAST(:i AS int)"), {"i": i})

            # Every client runs to its end (or its own error) before the engine is disposed: a
            # plain gather would return at the first error and leave the others' connections open.
            results = await asyncio.gather(*(one(i) for i in range(20)), return_exceptions=True)
        finally:
            await engine.dispose()
        errors = [str(result) for result in results if isinstance(result, BaseException)]
        return errors[0] if errors else None

    error = asyncio.run(main())
    assert error is not None
    assert "prepared statement" in error


def test_a_fleet_of_four_processes_shares_five_server_connections(
    tmp_path: Path, bouncer: PgBouncer, fleet_table: str, admin: Engine, app_name: str
) -> None:
    """4 processes x limit 5 = 20 client connections; the server never sees more than 5; each key once."""
    n = 2000
    with ActivitySampler(admin, app_name) as sampler:
        results = finish_fleet(start_fleet(tmp_path, bouncer, fleet_table, app_name, n, retry=False))
    for (runner, driver), r in zip(FLEET, results, strict=True):
        assert r["failed"] == [], (runner, driver, r["failed"][:5])
        assert r["unknown"] == [], (runner, driver)
        assert len(r["succeeded"]) == n, (runner, driver)
    assert sampler.samples > 10
    assert 1 <= sampler.peak <= POOL, f"{sampler.peak} server connections through a pool of {POOL}"
    expected = {f"p{k}-{i}" for k in range(len(FLEET)) for i in range(n)}
    assert keys(admin, fleet_table) == expected  # every unit committed, once (key is UNIQUE)
    assert rows(admin, fleet_table) == len(expected)


def test_a_pooler_restart_mid_run_loses_nothing_and_commits_nothing_twice(
    tmp_path: Path, bouncer: PgBouncer, fleet_table: str, admin: Engine, app_name: str
) -> None:
    """PgBouncer stopped (SIGTERM) and started again on its port mid-run, with a RetryPolicy: no hang."""
    n = 2000
    total = n * len(FLEET)
    procs = start_fleet(tmp_path, bouncer, fleet_table, app_name, n, retry=True)
    try:
        wait_until(lambda: rows(admin, fleet_table) >= total // 4, 120, "a quarter of the units committed")
        bouncer.restart()
        at_restart = rows(admin, fleet_table)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    results = finish_fleet(procs)
    assert at_restart < total, "the fleet finished before the restart: it tested nothing"
    committed = keys(admin, fleet_table)
    retried = sum(r["retried"] for r in results)
    for (runner, driver), r in zip(FLEET, results, strict=True):
        assert r["failed"] == [], (runner, driver, r["failed"][:5])
        assert set(r["succeeded"]) <= committed, (runner, driver)  # nothing reported ok was lost
    unknown = {key for r in results for key in r["unknown"]}
    succeeded = {key for r in results for key in r["succeeded"]}
    assert succeeded | unknown == {f"p{k}-{i}" for k in range(len(FLEET)) for i in range(n)}
    # A commit-unknown unit is never retried: it is in the table (it committed) or not, never twice.
    assert committed - succeeded <= unknown
    assert rows(admin, fleet_table) == len(committed)
    assert retried >= 1, "the restart cut no unit: the test did not exercise the retry"
    print(
        f"restart at {at_restart} rows; retried {retried}; commit-unknown {len(unknown)} "
        f"({len(unknown & committed)} committed)"
    )


def test_a_connection_discarded_through_the_pooler_never_has_its_server_backend_terminated(
    bouncer: PgBouncer, admin: Engine
) -> None:
    """Through PgBouncer the driver's pid is not the server's: a discard ends no (shared) backend."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    from boundeddb import ThreadOffloadRunner
    from boundeddb._dialects.postgresql import DIALECT

    url = bouncer.url("psycopg")
    engine = create_engine(url, **pgbouncer_engine_options(url))
    try:
        with ThreadOffloadRunner(sessionmaker(engine), limit=1) as runner:
            [server_pid] = runner.run_sync(
                [lambda s: int(s.execute(text("SELECT pg_backend_pid()")).scalar_one())]
            ).values()
            with engine.connect() as connection:
                connection.invalidate()  # as the runner discards a connection whose unit failed mid-statement
            assert not DIALECT.ending_connections(engine.url)
    finally:
        engine.dispose()
    with admin.connect() as connection:
        alive = connection.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": server_pid}
        )
        assert alive.scalar_one() == 1
