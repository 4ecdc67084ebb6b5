"""
The chaos soak's own PostgreSQL: an embedded server (the ``pgserver`` wheel's binaries) in a directory
of the run's, never the user's server, which the nemesis may crash.

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
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import NullPool

__all__ = ["ChaosServer", "server_available"]

#: Settings given to the server at every start (``postgres -c name=value``).
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


class ChaosServer:
    """
    A private PostgreSQL: started on creation, crashed and started again on demand.

    Its data directory is a temporary directory of its own, not under the run's (which may be a
    pytest ``tmp_path``): as root, pgserver runs the server as another user, and every pytest process
    that starts makes ``/tmp/pytest-of-root`` private again, after which the server could not be
    started there.
    """

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR when run as root
            import pgserver

        self._pgserver = pgserver
        self._directory = Path(tempfile.mkdtemp(prefix="boundeddb-chaos-pg-"))
        self._server = pgserver.get_server(self._directory / "pgdata", cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self.socket_dir: Path = info.socket_dir
        #: The server's socket, which the proxy forwards to.
        self.socket_path = str(info.socket_path)
        self.url: URL = make_url(self._server.get_uri())
        #: Starts since creation: after a crash, the count of crashes survived.
        self.starts = 0
        self._stop("fast")
        self.start()
        self.admin: Engine = self.engine("chaos-admin")

    def engine(self, app: str, **options: Any) -> Engine:
        """A psycopg engine straight to the server (no proxy), with ``app`` as its application_name."""
        url = self.url.set(drivername="postgresql+psycopg")
        return create_engine(
            url,
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={"application_name": app, "connect_timeout": 5},
            **options,
        )

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        self._pgserver.pg_ctl(
            list(args), pgdata=self._server.pgdata, user=self._server.system_user, timeout=timeout
        )

    def start(self) -> None:
        """Start the server with :data:`SETTINGS` (unix socket only); return once it accepts connections."""
        options = ["-o", '-h ""', "-o", f"-k {self.socket_dir}"]
        for name, value in SETTINGS.items():
            options += ["-o", f"-c {name}={value}"]
        self._pg_ctl("-w", *options, "-l", str(self._server.log), "start")
        self.starts += 1

    def _stop(self, mode: str) -> None:
        self._pg_ctl("-w", "-m", mode, "stop")

    def crash(self) -> None:
        """An immediate stop (every process ends, nothing is flushed), then a start: crash recovery."""
        self._stop("immediate")
        self.start()

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

    def crash_backend(self, pid: int) -> None:
        """SIGKILL one backend: the postmaster ends every other one and recovers, without restarting."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until a connection succeeds (after a backend crash, recovery takes a moment)."""
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
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._stop("immediate")
        # pgserver knows only the first postmaster: its own stop fails, and says so, for the one we
        # started since. The directory goes all the same.
        quiet = logging.getLogger("pgserver")
        level, quiet.level = quiet.level, logging.CRITICAL + 1
        try:
            self._server.cleanup()
        finally:
            quiet.setLevel(level)
            shutil.rmtree(self._directory, ignore_errors=True)
