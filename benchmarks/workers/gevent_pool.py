"""
The ``gevent`` scenario's process: ``python -m benchmarks.workers.gevent_pool CONFIG_JSON``.

Post 003's third contender: gevent's monkey-patching and psycogreen make psycopg2 cooperative, and
a gevent ``Pool(L)`` runs the post's operations, each in its own ``Session`` committed at its end,
on a sync engine of L connections.  It patches only this process (the suite's own process never
imports gevent).  It prints ``ready``, waits for a line on stdin, runs, and prints one JSON line:
elapsed seconds, each op's latency, this process's CPU seconds, failures.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402  (after monkey-patching, as gevent requires)
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from gevent.pool import Pool  # noqa: E402
from psycogreen.gevent import patch_psycopg  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from ..workload import Op, make_ops, op_sync  # noqa: E402

patch_psycopg()


def main(config: dict[str, Any]) -> dict[str, Any]:
    limit = int(config["limit"])
    engine = create_engine(
        config["url"],
        pool_size=limit,
        max_overflow=0,
        pool_timeout=60,
        connect_args={"application_name": config["app"]},
    )
    sessions = sessionmaker(engine, expire_on_commit=False)
    ops = make_ops(config["n"], config["seed"])
    latencies: list[float] = []
    errors: list[str] = []

    def one(op: Op) -> None:
        started = time.perf_counter()
        session: Session = sessions()
        try:
            op_sync(session, op)
            session.commit()
        except Exception as exc:
            session.rollback()
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        finally:
            session.close()
        latencies.append(time.perf_counter() - started)

    warm = [engine.connect() for _ in range(limit)]
    for conn in warm:
        conn.close()
    print("ready", flush=True)
    sys.stdin.readline()
    cpu0, started = time.process_time(), time.perf_counter()
    Pool(limit).map(one, ops)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
    engine.dispose()
    return {
        "elapsed_s": elapsed,
        "cpu_s": cpu,
        "latencies": latencies,
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
