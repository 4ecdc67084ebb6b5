"""Ctrl-C: SIGINT sent to a process whose run_sync has units sleeping on the server."""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from boundeddb.testing import driver_url
from tests.support.faults import active_queries, wait_until
from tests.support.kits import eventually
from tests.support.probes import backends, terminate_backends

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


CHILD = """
import faulthandler
import os
import signal
import sys
import threading

faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a hang
# As a program started from a terminal: a suite run as a background job (`cmd &` in a script)
# hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
signal.signal(signal.SIGINT, signal.default_int_handler)
import logging

logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(message)s")
logging.getLogger("boundeddb").setLevel(logging.DEBUG)  # how the cancellation went, if it hangs

from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from boundeddb import ThreadOffloadRunner

LIMIT = 4
engine = create_engine(
    os.environ["BOUNDEDDB_CHILD_URL"],
    connect_args={"application_name": os.environ["BOUNDEDDB_CHILD_APP"]},
    pool_size=LIMIT,
    max_overflow=0,
)
runner = ThreadOffloadRunner(sessionmaker(engine), limit=LIMIT)
lock = threading.Lock()
arrived = 0


def unit(session):
    global arrived
    session.execute(text("SELECT 1"))
    with lock:
        arrived += 1
        if arrived == LIMIT:
            print("started", flush=True)
    session.execute(text("SELECT pg_sleep(30)"))


try:
    runner.run_sync([unit] * (2 * LIMIT))
except KeyboardInterrupt:
    print(f"interrupted checkedout={engine.pool.checkedout()}", flush=True)
    raise
print("finished without an interrupt", flush=True)
"""


def backend_states(admin: Engine, app: str) -> list[tuple[str, str]]:
    """(state, query) of each backend of ``app``."""
    with admin.connect() as connection:
        rows = connection.execute(
            text("SELECT state, query FROM pg_stat_activity WHERE application_name = :app"), {"app": app}
        )
        return [(str(state), str(query)) for state, query in rows]


def logged(stderr: str) -> list[str]:
    """The child's log lines (its DEBUG log of the cancellation), without the threads' dump."""
    return [line for line in stderr.splitlines() if line[:4].isdigit()][-20:]  # they start with the time


def read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))


def next_line(lines: queue.Queue[str], timeout: float) -> str | None:
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def test_ctrl_c_stops_run_sync_promptly_and_leaves_no_backend(
    tmp_path: Path, admin: Engine, pg_url: Any
) -> None:
    """SIGINT during run_sync (4 units in pg_sleep(30)): KeyboardInterrupt fast, no backend left behind."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    app = f"bdbt-sigint-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "BOUNDEDDB_CHILD_URL": driver_url(pg_url, "psycopg").render_as_string(hide_password=False),
        "BOUNDEDDB_CHILD_APP": app,
        "PYTHONWARNINGS": "error",
    }
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=read_lines, args=(child.stdout, lines), daemon=True)
    reader.start()
    took = 0.0
    gone = False
    hung_backends: list[tuple[str, str]] = []
    try:
        first = next_line(lines, 30)
        if first == "started":
            wait_until(lambda: active_queries(admin, app, "%pg_sleep(30)%") == 4, 10, "4 units in pg_sleep")
            interrupted = time.monotonic()
            child.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)
            took = time.monotonic() - interrupted
            if child.poll() is None:  # stuck: what the server and the child's threads were doing
                hung_backends = backend_states(admin, app)
                child.send_signal(signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=2)
            # pg_sleep(30) does not notice a vanished client: only a real cancel stops it before 30 s.
            gone = child.poll() is not None and eventually(lambda: backends(admin, app) == 0, 10)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        reader.join(5)
        assert child.stdout is not None
        assert child.stderr is not None
        stderr = child.stderr.read()
        child.stdout.close()
        child.stderr.close()
        terminate_backends(admin, app)  # a killed child leaves its pg_sleep(30) running
    assert first == "started", f"the child did not start its units: {first!r}, {stderr[-2000:]}"
    assert child.returncode != -signal.SIGKILL, (
        f"the child was still running {took:.0f} s after SIGINT: the statements were not cancelled; "
        f"its backends (state, query): {hung_backends}; its log: {logged(stderr)}; "
        f"its threads:\n{stderr[-6000:]}"
    )
    assert took < 5, f"the child took {took:.1f} s to exit after SIGINT"
    assert child.returncode == -signal.SIGINT, (child.returncode, stderr[-2000:])
    assert "KeyboardInterrupt" in stderr
    assert next_line(lines, 5) == "interrupted checkedout=0"
    assert gone, "10 s after the child exited, its backends were still there"
