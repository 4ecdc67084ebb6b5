"""
``sync``: the post's "Sync story" — one sync Session per op, one op at a time.

Reproduces ``sync_main.py`` of "Soft touch to SQLAlchemy async I/O" (203 s for 35,000 ops
there): psycopg2, as in the post, so one connection carries the whole run.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import sessionmaker

from ._harness import Context, Probe
from ._workload import op_sync

DRIVER = "psycopg2"


def run(ctx: Context) -> None:
    ctx.reset()
    app = ctx.app_name("sync")
    engine = ctx.db.sync_engine(app, pool_size=1, driver=DRIVER)
    sessions = sessionmaker(engine, expire_on_commit=False)
    config = {"driver": DRIVER, "pool_size": 1, "max_overflow": 0, "concurrency": 1}
    latencies: list[float] = []
    try:
        probe = Probe(ctx, "sync", "sync", total=len(ctx.ops), app_name=app, config=config)
        probe.m.extra["note"] = "psycopg2 and one op at a time, as in the post"
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
