"""
The soak's view from the server: every 50 ms, which backends each workload and job holds.

Two promises are checked on each sample, half a second after it was taken (by then the clients have
written down the connections they had discarded before it):

- **the bound**: a runner's backends, but for those of connections it discarded, never outnumber
  its ``limit``;
- **discarded means ended**: a backend of a connection a pool discarded (invalidated or closed) is
  not running a statement or holding a transaction 1 s after, or 1 s after a new connection could
  reach the server again: after an ``unreachable`` episode that it fell in (the library ends it
  from a new connection), and later by 8 times the most delay of a ``latency`` episode (a new
  connection's few round trips, each way delayed).

A backend belongs to a discarded connection if its pid was discarded and it had started by then (a
pid the server hands out again after a crash is another backend). The backends of a SIGKILLed job
that had started by then no longer count toward the bound. MariaDB's connections are checked for the
bound the same way, by database, and for
statements still running 1 s after their connection was discarded.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from tests.chaos.records import Lines

__all__ = ["Sampler"]

INTERVAL_S = 0.05
#: How long after a sample it is checked: the clients' discards before it are on disk by then.
SETTLE_S = 0.5
#: How long a discarded connection's backend may still run a statement or hold a transaction.
GRACE_S = 1.0
#: How many of a latency episode's delays a side connection's ending of a backend may take.
_LATENCY_DELAYS = 8
_BUSY = ("active", "idle in transaction", "idle in transaction (aborted)")
_ACTIVITY = text(
    "SELECT pid, application_name, state, extract(epoch FROM backend_start), left(query, 80) "
    "FROM pg_stat_activity WHERE application_name LIKE 'chaos-%' AND application_name <> 'chaos-admin' "
    "AND backend_type = 'client backend'"
)
_PROCESSLIST = text("SELECT id, command, info, time FROM information_schema.processlist WHERE db = :db")


@dataclasses.dataclass(frozen=True)
class _Backend:
    pid: int
    app: str
    state: str
    started: float
    query: str


class Sampler:
    """Samples the backends of the workloads and jobs, and checks each sample (the module docstring)."""

    def __init__(
        self,
        out: Path,
        admin: Engine,
        limits: dict[str, int],
        anomalies: Lines,
        mysql: tuple[Engine, str, int] | None = None,
    ) -> None:
        self._out = out
        self._admin = admin
        self._limits = limits
        self._anomalies = anomalies
        self._mysql = mysql
        #: (app, server id) -> when the connection was discarded.
        self._discarded: dict[tuple[str, int], float] = {}
        #: app -> when its job's processes were SIGKILLed.
        self._killed: dict[str, list[float]] = collections.defaultdict(list)
        self._offsets: dict[Path, int] = {}
        #: The nemesis's unreachable episodes, (start, end), and latency episodes, (start, end, most).
        self._unreachable: list[tuple[float, float]] = []
        self._latency: list[tuple[float, float, float]] = []
        self._pending: collections.deque[tuple[float, list[_Backend], list[tuple[int, str, str, int]]]] = (
            collections.deque()
        )
        self._reported: set[tuple[str, int]] = set()
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.samples = self.checked = self.failed_samples = 0
        self.peaks: dict[str, int] = collections.Counter()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Take samples for one more grace period, check every sample, and end."""
        time.sleep(GRACE_S + SETTLE_S)
        self._stop.set()
        self._thread.join(30)

    def killed(self, app: str, when: float) -> None:
        """
        A job's process was SIGKILLed at ``when``: its backends that had started then no longer count
        toward its limit. No runner can end them: the server ends each once it reads its client's
        end, at once unless the network is frozen, or a statement of it runs.
        """
        with self._lock:
            self._killed[app].append(when)

    # -- the thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self._sample()
            self._read_discards()
            self._check_settled(time.time() - SETTLE_S)
            self._stop.wait(max(0.0, INTERVAL_S - (time.monotonic() - started)))
        self._read_discards()
        self._check_settled(float("inf"))
        for connection in self._connections.values():
            with contextlib.suppress(Exception):
                connection.close()

    def _query(
        self, which: str, engine: Engine, statement: Any, parameters: dict[str, Any]
    ) -> list[Any] | None:
        """Rows of ``statement`` on a connection kept open for it (opened again after a failure), or None."""
        connection = self._connections.get(which)
        try:
            if connection is None:
                connection = self._connections[which] = engine.connect()
            return list(connection.execute(statement, parameters))
        except Exception:
            self._connections.pop(which, None)
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()
            return None

    def _sample(self) -> None:
        rows = self._query("postgresql", self._admin, _ACTIVITY, {})
        if rows is None:
            self.failed_samples += 1  # the server is down: no sample
            return
        now = time.time()
        backends = [_Backend(r[0], r[1], r[2] or "", float(r[3]), r[4] or "") for r in rows]
        mysql: list[tuple[int, str, str, int]] = []
        if self._mysql is not None:
            engine, database, _ = self._mysql
            listed = self._query("mysql", engine, _PROCESSLIST, {"db": database}) or []
            mysql = [(int(r[0]), str(r[1]), str(r[2] or ""), int(r[3] or 0)) for r in listed]
        self.samples += 1
        self._pending.append((now, backends, mysql))

    def _read_discards(self) -> None:
        """The clients' discards, and the nemesis's faults that keep a new connection from the server."""
        for path in [*self._out.glob("discards-*.jsonl"), self._out / "faults-main.jsonl"]:
            for record in self._new_lines(path):
                if "app" in record:
                    self._discarded[(record["app"], int(record["id"]))] = float(record["t"])
                elif record["kind"] == "unreachable":
                    self._unreachable.append((record["t"], record["t"] + record["seconds"]))
                elif record["kind"] == "latency":
                    self._latency.append((record["t"], record["t"] + record["seconds"], record["most"]))

    def _new_lines(self, path: Path) -> list[dict[str, Any]]:
        """The records written to ``path`` since it was last read, whole lines only."""
        if not path.exists():
            return []
        records = []
        offset = self._offsets.get(path, 0)
        with path.open(encoding="utf-8") as lines:
            lines.seek(offset)
            while line := lines.readline():
                if not line.endswith("\n"):
                    break  # being written: read it next time
                offset += len(line.encode())
                records.append(json.loads(line))
        self._offsets[path] = offset
        return records

    def _due(self, discarded: float) -> float:
        """When the backend of a connection discarded at ``discarded`` must have ended (module docstring)."""
        due = discarded + GRACE_S
        for start, end in self._unreachable:
            if start < due and discarded < end:
                due = max(due, end + GRACE_S)
        for start, end, most in self._latency:
            if start < due and discarded < end:
                due += _LATENCY_DELAYS * most
        return due

    def _discarded_at(self, backend: _Backend) -> float | None:
        """When ``backend``'s connection was discarded, or None if it was not (yet)."""
        when = self._pid_discarded_at(backend)
        if when is not None:
            return when
        with self._lock:
            for killed in self._killed.get(backend.app, ()):
                if killed > backend.started:
                    return killed
        return None

    def _pid_discarded_at(self, backend: _Backend) -> float | None:
        """When a client discarded ``backend``'s connection itself (not by dying), or None."""
        when = self._discarded.get((backend.app, backend.pid))
        return when if when is not None and when >= backend.started - 0.5 else None

    def _check_settled(self, before: float) -> None:
        while self._pending and self._pending[0][0] <= before:
            taken, backends, mysql = self._pending.popleft()
            self.checked += 1
            self._check_sample(taken, backends)
            if self._mysql is not None:
                self._check_mysql(taken, mysql)

    def _check_sample(self, taken: float, backends: list[_Backend]) -> None:
        live: dict[str, list[_Backend]] = collections.defaultdict(list)
        for backend in backends:
            discarded = self._discarded_at(backend)
            if discarded is None or discarded > taken:
                live[backend.app].append(backend)
            strict = self._pid_discarded_at(backend)
            if strict is not None and taken > self._due(strict) and backend.state in _BUSY:
                key = (backend.app, backend.pid)
                if key not in self._reported:
                    self._reported.add(key)
                    self._anomalies.write(
                        kind="discarded-backend-busy",
                        detail=f"{backend.app} pid {backend.pid} {backend.state} "
                        f"{taken - strict:.1f} s after its "
                        f"connection was discarded: {backend.query!r}",
                    )
        for app, counted in live.items():
            self.peaks[app] = max(self.peaks[app], len(counted))
            limit = self._limits.get(app)
            if limit is not None and len(counted) > limit:
                shown = [(b.pid, b.state, round(taken - b.started, 2), b.query[:40]) for b in counted]
                self._anomalies.write(
                    kind="bound",
                    detail=f"{app}: {len(counted)} backends > limit {limit} at {taken:.3f}: "
                    f"(pid, state, age, query) {shown}",
                )

    def _check_mysql(self, taken: float, rows: list[tuple[int, str, str, int]]) -> None:
        assert self._mysql is not None
        _, database, limit = self._mysql
        app = f"mysql:{database}"
        live = []
        for ident, command, info, seconds in rows:
            when = self._discarded.get((app, ident))
            if when is None or when > taken:
                live.append((ident, command, seconds, info[:40]))
            elif taken > when + GRACE_S and command == "Query" and (app, ident) not in self._reported:
                self._reported.add((app, ident))
                self._anomalies.write(
                    kind="discarded-backend-busy",
                    detail=f"MariaDB connection {ident} still running {info!r} "
                    f"{taken - when:.1f} s after its discard",
                )
        self.peaks[app] = max(self.peaks[app], len(live))
        if len(live) > limit:
            self._anomalies.write(
                kind="bound",
                detail=f"{app}: {len(live)} connections > limit {limit} at {taken:.3f}: "
                f"(id, command, s, info) {live}",
            )
