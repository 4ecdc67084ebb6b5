"""
``gevent``: post 003's third contender, greenlets on a cooperative psycopg2 (psycogreen).

The same op sequence as the other rows of the throughput table, run by a gevent ``Pool(L)`` in a
process of its own (:mod:`benchmarks.workers.gevent_pool`): monkey-patching must not touch the suite's
process.  Each op has its own ``Session``, committed at its end, on a sync psycopg2 engine with
``pool_size=L``.  Client CPU is the worker's own (``time.process_time`` there); the connection
sampler and server CPU are the suite's, as for every row.  Where gevent or psycogreen is missing
(the ``bench`` extra installs both) the row records that as its error.
"""

from __future__ import annotations

import json

from .. import workers
from ..harness import Context, Probe
from ..measurement import Measurement
from ..scenario import throughput_row


def run(ctx: Context) -> None:
    ctx.reset()
    label = f"gevent Pool (L={ctx.limit})"
    app = ctx.app_name(label)
    config = {
        "driver": "psycopg2 + psycogreen",
        "limit": ctx.limit,
        "pool_size": ctx.limit,
        "max_overflow": 0,
    }
    worker_config = {
        "url": ctx.db.driver_url("psycopg2").render_as_string(hide_password=False),
        "limit": ctx.limit,
        "app": app,
        "n": len(ctx.ops),
        "seed": ctx.seed,
    }
    proc = workers.start("gevent_pool", json.dumps(worker_config))
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        if (line := proc.stdout.readline().strip()) != "ready":
            _, err = proc.communicate(timeout=60)
            last = [x for x in err.strip().splitlines() if x and not x[0].isspace()]
            error = f"the gevent worker did not start: {line!r} {' | '.join(last[-2:])}"[:500]
            ctx.results.append(Measurement("gevent", label, error=error, config=config))
            return
        with Probe(ctx, "gevent", label, total=len(ctx.ops), app_name=app, config=config) as p:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                raise RuntimeError(f"the gevent worker failed: {err.strip()[-400:]}")
            result = json.loads(out.strip().splitlines()[-1])
            p.latencies = result["latencies"]
            p.succeeded = len(result["latencies"])
            p.failed = result["failed"]
            p.done = p.succeeded
        p.m.client_cpu_s = result["cpu_s"]
        p.m.extra["note"] = (
            "a gevent Pool(L) of greenlets on psycopg2 made cooperative by psycogreen, a Session per op, "
            "in a process of its own (its client CPU is that process's)"
        )
        if result["first_error"]:
            p.m.extra["first_error"] = result["first_error"]
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()


SCENARIO = throughput_row(
    "gevent",
    run,
    "post 003's contender: a gevent Pool(L) on psycopg2 + psycogreen, in a process of its own",
    seconds=10,
)
