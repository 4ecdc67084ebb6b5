"""
``sync``: the post's "Sync story" — one sync Session per op, one op at a time.

Reproduces ``sync_main.py`` of "Soft touch to SQLAlchemy async I/O" (203 s for 35,000 ops
there): psycopg2, as in the post, so one connection carries the whole run.  With ``--database
mysql`` the driver is pymysql.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import sessionmaker

from ..harness import Context, Probe
from ..scenario import MYSQL, POSTGRESQL, throughput_row
from ..workload import op_sync


def run(ctx: Context) -> None:
    ctx.reset()
    app = ctx.app_name("sync")
    driver = ctx.db.sync_driver  # psycopg2 on PostgreSQL, as in the post
    engine = ctx.db.sync_engine(app, pool_size=1, driver=driver)
    sessions = sessionmaker(engine, expire_on_commit=False)
    config = {"driver": driver, "pool_size": 1, "max_overflow": 0, "concurrency": 1}
    latencies: list[float] = []
    try:
        probe = Probe(ctx, "sync", "sync", total=len(ctx.ops), app_name=app, config=config)
        as_in_post = ", as in the post" if driver == "psycopg2" else ", as the post's psycopg2 script does"
        probe.m.extra["note"] = f"{driver} and one op at a time{as_in_post}"
        with probe as p:
            p.latencies = latencies
            for op in ctx.ops:
                start = time.perf_counter()
                with sessions() as session:
                    op_sync(session, op)
                    session.commit()
                latencies.append(time.perf_counter() - start)
                p.tick()
    finally:
        engine.dispose()


SCENARIO = throughput_row(
    "sync",
    run,
    "the post's sync script: one Session per op, one at a time (psycopg2; pymysql on MySQL)",
    seconds=12,
    databases=(POSTGRESQL, MYSQL),
)
