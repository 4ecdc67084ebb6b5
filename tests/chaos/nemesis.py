"""
The soak's nemesis: a fault every 1 to 2 seconds, drawn by a seeded random generator, and a crash of
the server about every 90 seconds.

The faults (:data:`FAULTS`, each with its weight): a COMMIT's reply dropped, a COMMIT dropped,
connections reset, frozen half-open then reset, latency, the server unreachable for a moment,
``pg_terminate_backend``, the jobs' processes and ``ProcessRunner``'s workers SIGKILLed, and on
MariaDB ``KILL CONNECTION`` and the proxy's faults. The crashes (:data:`CRASHES`, in turn): an
immediate restart; a COMMIT dropped, then an immediate restart while new connections wait, and
other clients' transactions straight to the server before they go on (so that the lost
transaction's id is handed out again before anyone asks about it); a backend SIGKILLed, after
which the server recovers without restarting. Each fault is written to ``faults-*.jsonl``.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from tests.chaos.jobs import JobSupervisor
from tests.chaos.proxy import FaultProxy
from tests.chaos.records import Lines
from tests.chaos.server import ChaosServer

__all__ = ["CRASHES", "FAULTS", "Nemesis"]

#: Each fault and its weight in the draw; ``mysql-*`` only where MariaDB takes part.
FAULTS: dict[str, float] = {
    "commit-reply-drop": 3,
    "commit-drop": 2,
    "reset": 2,
    "reset-all": 0.3,
    "freeze": 1,
    "latency": 1,
    "unreachable": 0.5,
    "terminate": 2,
    "kill-load": 0.4,
    "kill-map": 0.4,
    "kill-processes": 0.2,
    "kill-worker": 0.4,
    "mysql-kill": 0.6,
    "mysql-reset": 0.4,
    "mysql-commit-reply-drop": 0.6,
    "mysql-freeze": 0.3,
}
#: The crashes, in turn, about every :data:`CRASH_EVERY_S` seconds.
CRASHES = ("crash", "lost-commit-crash", "backend-crash")
CRASH_EVERY_S = 90.0
#: Writing transactions straight to the server after a lost-commit crash, before the clients go on.
REUSING_TRANSACTIONS = 30
_CHAOS_BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'chaos-%' "
    "AND application_name <> 'chaos-admin' AND backend_type = 'client backend'"
)


class Nemesis:
    """Injects faults from a thread until stopped. See the module docstring."""

    def __init__(
        self,
        rng: random.Random,
        server: ChaosServer,
        admin: Engine,
        pg: FaultProxy,
        jobs: dict[str, JobSupervisor],
        log: Lines,
        *,
        faults: list[str],
        crash_every: float | None = CRASH_EVERY_S,
        mysql: tuple[FaultProxy, Engine, str] | None = None,
    ) -> None:
        self._rng = rng
        self._server = server
        #: Straight to the soak's database, not through the proxy.
        self._admin = admin
        self._pg = pg
        self._jobs = jobs
        self._log = log
        self._mysql = mysql
        self._crash_every = crash_every
        self._faults = [f for f in faults if not f.startswith("mysql-") or mysql is not None]
        self._weights = [FAULTS[f] for f in self._faults]
        self.counts: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-nemesis", daemon=True)
        self._timers: list[threading.Timer] = []
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop, undo what lasts (holds, refusals, latency, armed traps), and wait for the server."""
        self._stop.set()
        self._thread.join(60)
        for timer in self._timers:
            timer.cancel()
        for proxy in self._proxies():
            proxy.disarm()
            proxy.refuse_new(False)
            proxy.release_new()
            proxy.latency(0.0, 0.0)
        self._server.wait_ready()

    def _proxies(self) -> list[FaultProxy]:
        return [self._pg] + ([self._mysql[0]] if self._mysql is not None else [])

    def _run(self) -> None:
        rng = self._rng
        every = self._crash_every
        next_crash = time.monotonic() + rng.uniform(0.8, 1.2) * every if every else float("inf")
        crashes = 0
        try:
            while not self._stop.wait(rng.uniform(1.0, 2.0)):
                if every and time.monotonic() >= next_crash:
                    self._crash(CRASHES[crashes % len(CRASHES)])
                    crashes += 1
                    next_crash = time.monotonic() + rng.uniform(0.8, 1.2) * every
                elif self._faults:
                    self._fault(rng.choices(self._faults, self._weights)[0])
        except BaseException as error:  # the soak's own failure: reported, never hidden
            self.error = error

    def _note(self, kind: str, **detail: Any) -> None:
        self.counts[kind] += 1
        self._log.write(kind=kind, **detail)

    def _later(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        self._timers = [t for t in self._timers if t.is_alive()]
        self._timers.append(timer)
        timer.start()

    # -- faults --------------------------------------------------------------------------------------------

    def _fault(self, kind: str) -> None:
        rng, pg = self._rng, self._pg
        if kind.startswith("mysql-"):
            self._mysql_fault(kind)
        elif kind == "commit-reply-drop":
            self._note(kind, count=pg.arm_commit("drop-reply", rng.randint(1, 3)).left)
        elif kind == "commit-drop":
            self._note(kind, count=pg.arm_commit("drop", rng.randint(1, 2)).left)
        elif kind == "reset":
            self._note(kind, links=pg.reset(rng.randint(1, 5), rng))
        elif kind == "reset-all":
            self._note(kind, links=pg.reset(None, rng))
        elif kind == "freeze":
            seconds = rng.uniform(0.5, 4.0)
            self._note(kind, links=pg.freeze(rng.randint(1, 4), seconds, rng), seconds=round(seconds, 2))
        elif kind == "latency":
            most, seconds = rng.uniform(0.05, 0.5), rng.uniform(2.0, 6.0)
            pg.latency(most, seconds, random.Random(rng.random()))
            self._note(kind, most=round(most, 3), seconds=round(seconds, 2))
        elif kind == "unreachable":
            seconds = rng.uniform(0.5, 3.0)
            pg.refuse_new(True)
            self._later(seconds, lambda: pg.refuse_new(False))
            self._note(kind, seconds=round(seconds, 2))
        elif kind == "terminate":
            self._terminate(rng.randint(1, 3))
        elif kind == "kill-worker":
            job = self._jobs.get("processes")
            if job is not None and job.kill_worker(rng):
                self._note(kind)
        elif kind.startswith("kill-"):
            job = self._jobs.get(kind.removeprefix("kill-"))
            if job is not None and job.kill(rng):
                self._note(kind)

    def _terminate(self, count: int) -> None:
        try:
            with self._admin.connect() as connection:
                killed = connection.execute(
                    text(
                        f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM ({_CHAOS_BACKENDS} "
                        "ORDER BY random() LIMIT :n) AS victims"
                    ),
                    {"n": count},
                ).scalar_one()
        except Exception as error:
            self._note("terminate-failed", error=type(error).__name__)
            return
        self._note("terminate", backends=killed)

    def _mysql_fault(self, kind: str) -> None:
        assert self._mysql is not None
        proxy, admin, database = self._mysql
        rng = self._rng
        if kind == "mysql-kill":
            with admin.connect() as connection:
                ids = [
                    row[0]
                    for row in connection.execute(
                        text("SELECT id FROM information_schema.processlist WHERE db = :db"), {"db": database}
                    )
                ]
                if not ids:
                    return
                victim = rng.choice(ids)
                try:
                    connection.execute(text(f"KILL CONNECTION {int(victim)}"))
                except Exception:
                    return  # gone meanwhile
            self._note(kind, id=victim)
        elif kind == "mysql-reset":
            self._note(kind, links=proxy.reset(rng.randint(1, 3), rng))
        elif kind == "mysql-commit-reply-drop":
            self._note(kind, count=proxy.arm_commit("drop-reply", 1).left)
        elif kind == "mysql-freeze":
            seconds = rng.uniform(0.5, 3.0)
            self._note(kind, links=proxy.freeze(rng.randint(1, 2), seconds, rng), seconds=round(seconds, 2))

    # -- crashes -------------------------------------------------------------------------------------------

    def _crash(self, kind: str) -> None:
        if kind == "crash":
            self._server.restart_immediately()
            self._note(kind)
        elif kind == "lost-commit-crash":
            self._lost_commit_crash()
        else:
            self._backend_crash()

    def _lost_commit_crash(self) -> None:
        """
        A COMMIT never arrives, and the server crashes at that moment (the proxy's loop sends the
        SIGQUIT), before other transactions' commits flush the lost one's WAL; while new connections
        wait, other clients' transactions straight to the server hand its id out again.
        """
        pg, server = self._pg, self._server
        postmaster = server.postmaster()
        pg.hold_new()
        trap = pg.arm_commit("drop", 1, then=lambda: server.quit_now(postmaster))
        fired = trap.fired.wait(10)
        pg.disarm()
        try:
            if fired:
                server.start_after_quit(postmaster)
            else:
                server.restart_immediately()
            reused = 0
            with self._admin.connect() as connection:
                for _ in range(REUSING_TRANSACTIONS):
                    connection.execute(text("INSERT INTO chaos_noise DEFAULT VALUES"))
                    reused += 1
        finally:
            pg.release_new()
        self._note("lost-commit-crash", commit_dropped=fired, transactions=reused)

    def _backend_crash(self) -> None:
        with self._admin.connect() as connection:
            pids = [row[0] for row in connection.execute(text(_CHAOS_BACKENDS))]
        if not pids:
            return
        pid = self._rng.choice(pids)
        self._server.crash_backend(pid)  # returns once the server is ready again
        self._note("backend-crash", pid=pid)
