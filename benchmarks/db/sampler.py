"""
The connection sampler: what the server and this process are doing while a scenario runs.

Every 100 ms, on a connection of its own, a :class:`Sampler` thread counts the scenario's server
connections (PostgreSQL: ``pg_stat_activity`` by application_name; MySQL/MariaDB: processlist by
database), reads the CPU time of their backend processes (or server threads) from /proc when the
server is local, and this process's RSS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from . import Server
from .proc import self_rss

SAMPLE_INTERVAL_S = 0.1


class Sampler(threading.Thread):
    """Samples a scenario's connections, backend CPU and this process's RSS; see the module docstring."""

    def __init__(self, db: Server, app_name: str, on_sample: Callable[[], None]) -> None:
        super().__init__(name=f"sampler-{app_name}", daemon=True)
        self._db = db
        self._conn = db.connect()
        self._app, self._on_sample, self._local = app_name, on_sample, db.local
        if self._local:
            db.cpu_baseline()
        self._stop_event = threading.Event()
        self._t0 = time.perf_counter()
        self.series: list[tuple[float, int]] = []
        self.backend_cpu: dict[int, float] = {}
        self.rss0 = self.rss_peak = self_rss()
        self.error: str | None = None

    def sample(self) -> None:
        backends = self._db.backends(self._conn, self._app)
        self.series.append((time.perf_counter() - self._t0, len(backends)))
        if self._local:
            for ident in backends:
                cpu = self._db.backend_cpu_s(ident)
                if cpu is not None:
                    self.backend_cpu[ident] = max(cpu, self.backend_cpu.get(ident, 0.0))
        self.rss_peak = max(self.rss_peak, self_rss())
        self._on_sample()

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_INTERVAL_S):
            try:
                self.sample()
            except Exception as exc:  # a lost sampler must not lose the scenario's measurement
                self.error = f"sampler stopped: {type(exc).__name__}: {exc}"[:200]
                return

    def finish(self) -> None:
        """Stop, then take one last sample while the scenario's connections are still open."""
        self._stop_event.set()
        if self.ident is not None:  # started
            self.join()
        if self.error is None:
            try:
                self.sample()
            except Exception as exc:
                self.error = f"sampler stopped: {type(exc).__name__}: {exc}"[:200]
        self._conn.close()

    def server_cpu(self) -> float | None:
        return sum(self.backend_cpu.values()) if self.backend_cpu else None
