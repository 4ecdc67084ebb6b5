"""
``threads``, ``threads-psycopg2``, ``threads-mysqldb``: ``boundeddb.ThreadOffloadRunner(limit=L)``.

Mike Bayer's "Asynchronous Python and Databases" (seed 003) argues that CRUD code belongs behind
a thread pool: the ORM's Python work dominates and threads on a blocking driver beat asyncio.
The runner is awaited from an event loop and runs sync units in L worker threads, each with its
own Session, on psycopg (3) and, as a second row, on psycopg2.  With ``--database mysql``,
``threads`` runs on pymysql and ``threads-mysqldb`` on mysqlclient (where it is installed: it builds
from source against libmariadb).  :func:`measure_sync` calls ``run_sync`` from plain sync code
instead (no event loop of the caller's), for the ``overhead`` scenario, with ``batch=`` for its
``threads-batch`` pair.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from sqlalchemy.orm import Session, sessionmaker

from boundeddb import ThreadOffloadRunner

from ..harness import Context, Probe
from ..scenario import MYSQL, POSTGRESQL, throughput_row
from ..workload import Op, sync_unit
from ._runner import pool_config, record


def run(ctx: Context) -> None:
    asyncio.run(measure(ctx, ctx.limit, ctx.ops, driver=ctx.db.thread_driver))


def run_psycopg2(ctx: Context) -> None:
    asyncio.run(measure(ctx, ctx.limit, ctx.ops, driver="psycopg2"))


def run_mysqldb(ctx: Context) -> None:
    """The runner on mysqlclient (MySQLdb), MySQL/MariaDB's C driver, where it is installed."""
    try:
        import MySQLdb  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "mysqlclient is not installed: pip install mysqlclient (it builds against libmariadb-dev "
            "and needs pkg-config)"
        ) from exc
    asyncio.run(measure(ctx, ctx.limit, ctx.ops, driver="mysqldb"))


def _setup(
    ctx: Context,
    limit: int | Literal["auto"],
    driver: str,
    label: str | None,
    default: str,
    capacity: int | None = None,
) -> tuple[str, str, str, Any, sessionmaker[Session], dict[str, Any]]:
    ctx.reset()
    scenario = "threads" if driver == ctx.db.thread_driver else f"threads-{driver}"
    label = label or f"{scenario}{default} (L={limit})"
    app = ctx.app_name(label)
    config = pool_config(limit, capacity, driver)
    engine = ctx.db.sync_engine(
        app, pool_size=config["pool_size"], driver=driver, pool_use_lifo=config["pool_use_lifo"]
    )
    sessions = sessionmaker(engine, expire_on_commit=False)
    return scenario, label, app, engine, sessions, config


async def measure(
    ctx: Context,
    limit: int | Literal["auto"],
    ops: list[Op],
    *,
    driver: str,
    group: str = "main",
    label: str | None = None,
    capacity: int | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """
    Run ``ops`` through ``await ThreadOffloadRunner(limit).run`` on fresh tables, on a pool of
    ``capacity`` connections (default: the limit; ``limit="auto"`` needs it, and gets
    ``pool_use_lifo=True``).
    """
    scenario, label, app, engine, sessions, config = _setup(ctx, limit, driver, label, "", capacity)
    config.update(extra or {})
    try:
        async with (
            ThreadOffloadRunner(sessions, limit=limit, errors="collect") as runner,
            Probe(
                ctx, scenario, label, total=len(ops), app_name=app, group=group, config=config, bar=False
            ) as p,
        ):
            units = [sync_unit(op) for op in ops]
            record(p, await runner.run(units, progress=p.runner_progress()))
    finally:
        engine.dispose()


def measure_sync(
    ctx: Context,
    limit: int,
    ops: list[Op],
    *,
    driver: str,
    group: str = "main",
    label: str | None = None,
    batch: int | None = None,
) -> None:
    """
    Run ``ops`` through ``ThreadOffloadRunner(limit, batch=batch).run_sync`` from sync code, on
    fresh tables.
    """
    default = "-run-sync" if batch is None else f"-run-sync-batch{batch}"
    scenario, label, app, engine, sessions, config = _setup(ctx, limit, driver, label, default)
    if batch is not None:
        config["batch"] = batch
    try:
        with (
            ThreadOffloadRunner(sessions, limit=limit, errors="collect", batch=batch) as runner,
            Probe(
                ctx, scenario, label, total=len(ops), app_name=app, group=group, config=config, bar=False
            ) as p,
        ):
            units = [sync_unit(op) for op in ops]
            record(p, runner.run_sync(units, progress=p.runner_progress()))
    finally:
        engine.dispose()


SCENARIO = throughput_row(
    "threads",
    run,
    "ThreadOffloadRunner(limit=L) (psycopg; pymysql on MySQL)",
    seconds=15,
    databases=(POSTGRESQL, MYSQL),
)
PSYCOPG2 = throughput_row(
    "threads-psycopg2", run_psycopg2, "ThreadOffloadRunner(limit=L) on psycopg2", seconds=12
)
MYSQLDB = throughput_row(
    "threads-mysqldb",
    run_mysqldb,
    "ThreadOffloadRunner(limit=L) on mysqlclient, where it is installed",
    seconds=15,
    databases=(MYSQL,),
)
