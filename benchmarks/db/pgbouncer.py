"""
A real PgBouncer in transaction mode on a free port, in front of a PostgreSQL server.

The fleet scenario and the tests through PgBouncer (``tests/stacks/test_pgbouncer.py``) both start
it from here.  Debian's ``pgbouncer`` package (1.18 on Debian 12) is what ``.ci/run`` installs;
neither installs anything itself: :func:`pgbouncer_binary` returns None where it is absent, the
scenario then records an error row and the tests are skipped with one reason.  PgBouncer refuses
to run as root, so as root it is started with ``-u`` as the ``postgres`` user (or ``nobody``), and
its directory and the embedded server's socket directory are made reachable for that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from sqlalchemy.engine import URL

#: The database name clients use at the pooler.
DATABASE = "bdbt"


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    """The user to switch to when running as root (PgBouncer will not run as root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    return None


class PgBouncer:
    """
    ``with PgBouncer(server_url, pool_size=5) as bouncer:`` — ``bouncer.url("asyncpg")`` is a
    client URL; :meth:`restart` stops it abruptly (SIGTERM: open client connections are cut) and
    starts it again on the same port. ``port=`` chooses the port (the tests give each of their
    workers a range of its own); by default the kernel picks a free one.
    """

    def __init__(
        self, server: URL, *, pool_size: int = 5, max_client_conn: int = 200, port: int | None = None
    ) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.binary = binary
        self.server = server
        self.pool_size = pool_size
        self.port = port or free_port()
        self.user = server.username or "postgres"
        self._dir = Path(tempfile.mkdtemp(prefix="bdbt-pgbouncer-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._write_config(max_client_conn)

    def _write_config(self, max_client_conn: int) -> None:
        host = self.server.host or str(self.server.query.get("host") or "127.0.0.1")
        target = [f"host={host}", f"dbname={self.server.database}", f"user={self.user}"]
        if self.server.port:
            target.append(f"port={self.server.port}")
        if self.server.password:
            target.append(f"password={self.server.password}")
        config = f"""
[databases]
{DATABASE} = {" ".join(target)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self._dir / "userlist.txt"}
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = {max_client_conn}
max_db_connections = {self.pool_size}
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
admin_users = {self.user}
stats_period = 1
logfile = {self._dir / "pgbouncer.log"}
pidfile = {self._dir / "pgbouncer.pid"}
"""
        (self._dir / "pgbouncer.ini").write_text(config)
        (self._dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        user = _run_as()
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(self._dir, entry.pw_uid, entry.pw_gid)
            for f in self._dir.iterdir():
                os.chown(f, entry.pw_uid, entry.pw_gid)
            if host.startswith("/"):  # the embedded server's socket directory is root's (0700)
                os.chmod(host, os.stat(host).st_mode | 0o011)

    def url(self, driver: str) -> URL:
        """A client URL for ``driver`` at the pooler."""
        return URL.create(
            f"postgresql+{driver}", username=self.user, host="127.0.0.1", port=self.port, database=DATABASE
        )

    def admin_dsn(self) -> str:
        """A libpq DSN for PgBouncer's admin console (``SHOW STATS``; simple query protocol only)."""
        return f"host=127.0.0.1 port={self.port} dbname=pgbouncer user={self.user}"

    def log(self) -> str:
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        argv = [self.binary, "-q"]
        if (user := _run_as()) is not None:
            argv += ["-u", user]
        self._proc = subprocess.Popen(
            [*argv, str(self._dir / "pgbouncer.ini")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise RuntimeError(f"pgbouncer exited at start: {err}\n{self.log()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)  # polling a port that is coming up, not synchronising on an event
        raise RuntimeError(f"pgbouncer did not listen on {self.port} within 10 s:\n{self.log()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM: an immediate shutdown that cuts every client and server connection."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stderr:
            self._proc.stderr.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
