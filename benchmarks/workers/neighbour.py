"""
A noisy neighbour: another application that loads the same server, in a process of its own.

``python -m benchmarks.workers.neighbour DSN CONNECTIONS`` opens CONNECTIONS connections (application_name
``bdbbench-neighbour``) and, on each in a thread, loops until it is terminated: a query that burns
server CPU (``sum`` over ``generate_series``), a scan of the suite's ``b`` table joined to ``a``,
and a small insert into ``a``, each in its own transaction.  It is a second app hammering the
same tables, as the auto-limit issue asks; nothing of it runs in the measured process, so its
Python work competes with the measured event loop only as any other process on the machine would.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import psycopg

from ..db.postgresql import APP_PREFIX
from ..db.schema import SCHEMA

APP_NAME = f"{APP_PREFIX}-neighbour"
STATEMENTS = (
    "SELECT sum(x) FROM generate_series(1, 200000) AS x",
    f"SELECT count(*) FROM {SCHEMA}.b AS b JOIN {SCHEMA}.a AS a ON a.id = b.a_id",
    f"INSERT INTO {SCHEMA}.a (data) VALUES ('neighbour')",
)


def _hammer(conn: psycopg.Connection[Any], stop: threading.Event) -> None:
    while not stop.is_set():
        for statement in STATEMENTS:
            conn.execute(statement)


def main(argv: list[str]) -> int:
    dsn, connections = argv[0], int(argv[1])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    conns = [psycopg.connect(dsn, autocommit=True, application_name=APP_NAME) for _ in range(connections)]
    threads = [threading.Thread(target=_hammer, args=(c, stop), daemon=True) for c in conns]
    for t in threads:
        t.start()
    while not stop.wait(0.1):
        pass
    for t in threads:
        t.join(timeout=10)
    for c in conns:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
