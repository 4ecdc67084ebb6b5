"""
A soak run's configuration: what runs, against what, for how long, from which seed.

The orchestrator (``__main__.py``) writes it to ``<run>/config.json``; the client process and each
job read it there. :func:`default_workloads` is the soak as documented; ``--workloads`` picks some.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

__all__ = ["Config", "Job", "Workload", "default_jobs", "default_workloads"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A workload of the client process: ``callers`` callers of one runner's ``submit()``, in a loop."""

    name: str
    #: ``submit``, ``bank`` or ``wrong-retry``.
    kind: str
    #: asyncpg, psycopg (async, or sync with ``threads``), aiomysql, pymysql.
    driver: str
    threads: bool = False
    limit: int = 8
    callers: int = 32
    batch: int = 0
    verify: bool = False
    timeout: float = 0.0
    attempts: int = 4
    #: Chance that a unit sleeps on the server first (up to ``timeout`` + 1 s: some time out).
    slow: float = 0.02
    #: Chance that a call is cancelled after a random delay (a cancel scope, or ``Task.cancel()``).
    cancel: float = 0.05

    @property
    def mysql(self) -> bool:
        return self.driver in ("aiomysql", "asyncmy", "pymysql")


@dataclasses.dataclass(frozen=True)
class Job:
    """A job run in a child process over and over, SIGKILLed by the nemesis, checked when it completes."""

    name: str
    #: ``load`` (``load()`` with a journal), ``map`` (``map()`` with a journal), ``processes``
    #: (``ProcessRunner.map()`` with a journal).
    kind: str
    #: Rows (load) or items (map, processes) of each job.
    size: int
    limit: int = 4


def default_workloads(*, mysql: bool) -> list[Workload]:
    """The documented soak's client workloads (MariaDB's where it answers)."""
    pg = [
        Workload("submit-asyncpg", "submit", "asyncpg", verify=True, timeout=3.0),
        Workload("submit-psycopg", "submit", "psycopg", timeout=3.0),
        Workload("submit-threads", "submit", "psycopg", threads=True, verify=True, timeout=3.0),
        Workload(
            "batch-asyncpg", "submit", "asyncpg", limit=4, batch=16, verify=True, timeout=3.0, cancel=0.15
        ),
        Workload(
            "batch-threads", "submit", "psycopg", threads=True, limit=4, callers=16, batch=16, cancel=0.1
        ),
        Workload(
            "bank", "bank", "asyncpg", limit=4, callers=8, verify=True, attempts=8, slow=0.0, cancel=0.03
        ),
    ]
    if not mysql:
        return pg
    return [
        *pg,
        Workload("mariadb-aiomysql", "submit", "aiomysql", limit=4, callers=12, timeout=3.0),
        Workload("mariadb-asyncmy", "submit", "asyncmy", limit=4, callers=12, timeout=3.0),
        Workload("mariadb-pymysql", "submit", "pymysql", threads=True, limit=4, callers=12, timeout=3.0),
    ]


def default_jobs(*, scale: float = 1.0) -> list[Job]:
    """The documented soak's jobs; ``scale`` shrinks them for a short run."""
    return [
        Job("load", "load", max(1000, int(200_000 * scale))),
        Job("map", "map", max(200, int(2_000 * scale))),
        Job("processes", "processes", max(200, int(2_000 * scale))),
    ]


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a soak's processes need to know of it."""

    out: Path
    seed: int
    pg_port: int
    pg_database: str
    #: The server itself, not through the proxy: for the checker, the sampler and job set-up.
    pg_direct_url: str
    workloads: list[Workload]
    jobs: list[Job]
    mysql_port: int | None = None
    mysql_database: str | None = None
    bank_accounts: int = 20
    bank_total: int = 20 * 1000

    def app(self, name: str) -> str:
        """The application_name of a workload's or job's connections: how the sampler tells them apart."""
        return f"chaos-{name}"

    def save(self) -> Path:
        path = self.out / "config.json"
        data: dict[str, Any] = dataclasses.asdict(self)
        data["out"] = str(self.out)
        path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Path) -> Config:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["out"] = Path(data["out"])
        data["workloads"] = [Workload(**w) for w in data["workloads"]]
        data["jobs"] = [Job(**j) for j in data["jobs"]]
        return cls(**data)
