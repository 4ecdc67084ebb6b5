"""
``fleet``: many processes, one database, through a real PgBouncer in transaction mode (issue 12).

:data:`PROCESSES` OS processes (:mod:`benchmarks.workers.fleet`) each run a
:class:`boundeddb.SemaphoreRunner` on asyncpg over their slice of the op sequence (the post's
creates and reads), all started together.  Three sides, measured in ABBA rounds
(:data:`ROUNDS`), each on fresh tables:

* **pooler** — each process at ``limit=`` :data:`LIMIT` through PgBouncer (Debian's 1.18,
  ``pool_mode = transaction``, ``default_pool_size = max_db_connections =`` :data:`POOL`), with
  :func:`boundeddb.pgbouncer_engine_options`: ``PROCESSES x LIMIT`` client connections over
  ``POOL`` server connections;
* **pooler, L=S/P** — through PgBouncer at ``limit = POOL // PROCESSES``: as many client
  connections as server connections, so nobody queues at the pooler: the hop alone;
* **direct** — each process straight to PostgreSQL at ``limit = POOL // PROCESSES``: the same
  number of server connections, split up front, without the pooler and with asyncpg's defaults;
* **direct, pooler options** — as direct, with the pooler's engine options (no prepared
  statement kept): what those options cost by themselves, apart from the extra hop.

Each side reports the fleet's ops/s (all units over the time from "go" to the last process
done), unit latency p50/p99 (``Outcome.latency_s``: session open to close, the pooler's wait for
a server connection included), the runner's slot wait p99, the server connections over time
(``pg_stat_activity`` every 100 ms: PgBouncer gives a server connection the application_name of
the client it serves, the side's own), and for the pooler the clients' wait for a server
connection from PgBouncer's ``SHOW STATS`` (``total_wait_time`` / ``total_xact_count``).

PgBouncer is started by :class:`benchmarks.db.pgbouncer.PgBouncer`, which the tests use too; where
it is not installed the scenario records one error row saying so.  The fleet runs
``min(N, FLEET_CAP)`` ops in all.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from .. import workers
from ..db.pgbouncer import DATABASE, PgBouncer, pgbouncer_binary
from ..harness import Context, Probe
from ..measurement import Measurement, error_line
from ..scenario import Scenario

GROUP = "fleet"
PROCESSES = 4
LIMIT = 5
POOL = 8
ROUNDS = 3
FLEET_CAP = 8_000


@dataclass(frozen=True)
class Side:
    name: str
    through_pooler: bool
    limit: int
    options: bool

    def label(self) -> str:
        return f"fleet: {self.name} ({PROCESSES} x L={self.limit})"


SIDES = (
    Side("pooler", True, LIMIT, True),
    Side("pooler, L=S/P", True, POOL // PROCESSES, True),
    Side("direct", False, POOL // PROCESSES, False),
    Side("direct, pooler options", False, POOL // PROCESSES, True),
)


def _pooler_stats(dsn: str) -> tuple[int, int] | None:
    """(total_xact_count, total_wait_time in µs) of the fleet's database at PgBouncer."""
    import psycopg2  # the admin console speaks the simple query protocol only

    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SHOW STATS")
            names = [d[0] for d in cur.description]
            for row in cur.fetchall():
                stats = dict(zip(names, row, strict=True))
                if stats["database"] == DATABASE:
                    return int(stats["total_xact_count"]), int(stats["total_wait_time"])
    finally:
        conn.close()
    return None


def _finish(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        if proc.returncode != 0:
            last = [line for line in stderr.strip().splitlines() if line and not line[0].isspace()]
            raise RuntimeError(f"a fleet process failed: {' | '.join(last[-3:])[-600:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def measure(ctx: Context, side: Side, bouncer: Any, k: int) -> None:
    ctx.reset()
    label = side.label()
    app = ctx.app_name(label)
    total = min(len(ctx.ops), FLEET_CAP)
    share = total // PROCESSES
    url = bouncer.url("asyncpg") if side.through_pooler else ctx.db.driver_url("asyncpg")
    config = {
        "side": side.name,
        "round": k,
        "processes": PROCESSES,
        "limit": side.limit,
        "pooler": side.through_pooler,
        "pool_size": POOL if side.through_pooler else side.limit,
        "engine_options": side.options,
        "driver": "asyncpg",
        "runner": "SemaphoreRunner",
    }
    procs = [
        workers.start(
            "fleet",
            json.dumps(
                {
                    "url": url.render_as_string(hide_password=False),
                    "limit": side.limit,
                    "options": side.options,
                    "app": app,
                    "total": len(ctx.ops),
                    "seed": ctx.seed,
                    "start": i * share,
                    "count": share,
                }
            ),
        )
        for i in range(PROCESSES)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                _finish(procs)  # raises with the process's error
                raise RuntimeError(f"a fleet process did not get ready: {line!r}")
        before = _pooler_stats(bouncer.admin_dsn()) if side.through_pooler else None
        with Probe(
            ctx, "fleet", label, total=share * PROCESSES, app_name=app, group=GROUP, config=config
        ) as p:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            results = _finish(procs)
            p.latencies = [x for r in results for x in r["latencies"]]
            p.succeeded = len(p.latencies)
            p.failed = sum(r["failed"] for r in results)
            p.done = p.succeeded
        m: Measurement = p.m
        waits = sorted(x for r in results for x in r["waits"])
        m.extra["slot_wait_p99_ms"] = round(waits[int(0.99 * (len(waits) - 1))] * 1e3, 3) if waits else None
        m.extra["first_error"] = next((r["first_error"] for r in results if r["first_error"]), None)
        m.extra["process_elapsed_s"] = [round(r["elapsed_s"], 2) for r in results]
        if before is not None:
            time.sleep(1.2)  # PgBouncer refreshes SHOW STATS every stats_period (1 s here)
            after = _pooler_stats(bouncer.admin_dsn())
            if after is not None:
                xacts, wait_us = after[0] - before[0], after[1] - before[1]
                m.extra.update(
                    pooler_xacts=xacts, pooler_wait_per_xact_ms=(wait_us / xacts / 1e3) if xacts else None
                )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                proc.wait()


def run(ctx: Context) -> None:
    if pgbouncer_binary() is None:
        error = "pgbouncer is not installed (apt-get install pgbouncer): the fleet scenario did not run"
        ctx.failed("fleet", "fleet", error, group=GROUP)
        return
    with PgBouncer(ctx.db.url, pool_size=POOL, max_client_conn=PROCESSES * LIMIT + 10) as bouncer:
        for k in range(ROUNDS):
            for side in SIDES if k % 2 == 0 else SIDES[::-1]:
                try:
                    measure(ctx, side, bouncer, k + 1)
                except Exception as exc:  # one failed side must not lose the rounds after it
                    error = error_line(exc, 600)
                    ctx.failed("fleet", side.label(), error, group=GROUP, side=side.name, round=k + 1)


SCENARIO = Scenario(
    name="fleet",
    run=run,
    what="4 processes through PgBouncer in transaction mode against the same direct (needs pgbouncer)",
    section="Many processes through PgBouncer",
    seconds=120,
    default=False,
)
