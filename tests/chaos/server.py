"""
The chaos soak's own PostgreSQL: a :class:`~tests.support.faults.PrivateServer` (the ``pgserver``
wheel's binaries, in a directory of its own), never the user's server, which the nemesis may crash.

It listens on a unix socket only; the soak's clients reach it through the fault proxy, the sampler
and the checker directly. Its settings make crashes tell: ``fsync`` is off (the soak crashes the
server's processes, never the machine, so what was written survives without it), and
``wal_writer_delay`` is 1 s, so a transaction whose COMMIT never arrived keeps its WAL in memory
for up to a second: after a crash its transaction id may be handed out again, the case that
``verify_commits`` must not answer wrongly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import time
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from tests.support.faults import PrivateServer

__all__ = ["ChaosServer", "server_available"]

#: The server's settings (``ALTER SYSTEM``, then a restart).
SETTINGS = {
    "max_connections": "300",
    "fsync": "off",
    "wal_writer_delay": "1000ms",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
}


def server_available() -> str | None:
    """Why the soak cannot have a server of its own here, or None if it can."""
    if importlib.util.find_spec("pgserver") is None:
        return "the pgserver wheel is not installed (it has no wheel for Python 3.13 and later)"
    return None


class ChaosServer(PrivateServer):
    """A private PostgreSQL with :data:`SETTINGS`, an admin engine, and crashes the nemesis can time."""

    def __init__(self) -> None:
        super().__init__()
        self.admin: Engine = self.engine("chaos-admin")
        self.configure(self.admin, **SETTINGS)

    def engine(self, app: str, **options: Any) -> Engine:
        """A psycopg engine straight to the server (no proxy), with ``app`` as its application_name."""
        return create_engine(
            self.url.set(drivername="postgresql+psycopg"),
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={"application_name": app, "connect_timeout": 5},
            **options,
        )

    def postmaster(self) -> int:
        """The running postmaster's pid."""
        return int((self._server.pgdata / "postmaster.pid").read_text().split()[0])

    def quit_now(self, postmaster: int) -> None:
        """What ``pg_ctl stop -m immediate`` does, at once and from any thread: SIGQUIT to the postmaster."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGQUIT)

    def start_after_quit(self, postmaster: int, timeout: float = 30) -> None:
        """Wait for the postmaster :meth:`quit_now` stopped to end, then start the server: crash recovery."""
        import psutil  # pgserver's dependency

        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(postmaster).wait(timeout)
        self.start()

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until a connection succeeds (after a crash, recovery takes a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.admin.connect() as connection:
                    connection.execute(text("SELECT 1"))
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.admin.dispose()
        self.cleanup()
