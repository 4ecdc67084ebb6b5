"""
The soak's jobs: ``load()`` and ``map()`` with a journal, and ``ProcessRunner.map()``, each run in a
child process that the nemesis SIGKILLs, and run again until it completes, then checked.

``python -m tests.chaos.jobs CONFIG JOB JOB_ID`` is one run of one job (the child): it exits 0 once
every row or item is done, 3 if some are not (a rerun settles them). A :class:`JobSupervisor`, a
thread of the orchestrator, runs the child over and over: each job until it completes, then checks
it (every row loaded once, every item's counter 1) and starts the next one, which takes the next
runner and driver of its kind (:data:`VARIANTS`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import functools
import itertools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import Pool

from boundeddb import (
    ChunkedRunner,
    Journal,
    LoadFailed,
    ProcessRunner,
    RetryPolicy,
    SemaphoreRunner,
    ThreadOffloadRunner,
)
from tests.chaos.config import Config, Job
from tests.chaos.engines import make_async_engine, make_sync_engine, proxied_url, watch_discards
from tests.chaos.records import Lines
from tests.chaos.schema import LOADED

__all__ = ["VARIANTS", "JobSupervisor"]

#: Each kind's runners and drivers, taken in turn by its successive jobs.
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "load": [("semaphore", "asyncpg"), ("threads", "psycopg")],
    "map": [
        ("semaphore", "asyncpg"),
        ("threads", "psycopg"),
        ("semaphore-batch", "psycopg"),
        ("chunked", "asyncpg"),
        ("threads-batch", "psycopg2"),
    ],
    "processes": [("processes", "asyncpg"), ("processes", "psycopg"), ("processes-batch", "asyncpg")],
}
#: The environment variable that tells a ProcessRunner worker where to write down its discards.
_WORKER_DISCARDS = "CHAOS_WORKER_DISCARDS"
_LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
#: What a driver raises for a connection that failed: what a map()'s lookup raises once its retries ran out.
_DRIVER_ERRORS = (sa_exc.DBAPIError, OSError, TimeoutError)
#: The exit status of a run that left rows or items to a rerun.
INCOMPLETE = 3
#: Patient: about 10 s of retries, which most crashes and outages of the soak are shorter than.
_RETRY = RetryPolicy(attempts=10, max_delay=2.0)


# -- the child ----------------------------------------------------------------------------------------------


def _rows(job_id: str, size: int) -> Iterator[dict[str, Any]]:
    for i in range(size):
        yield {"job": job_id, "i": i, "payload": f"{job_id} row {i}"}


async def bump_async(job_id: str, session: AsyncSession, item: int) -> int:
    """Add one to the item's counter: not idempotent, so a second commit shows."""
    await session.execute(
        text("UPDATE chaos_counters SET n = n + 1 WHERE job = :job AND item = :item"),
        {"job": job_id, "item": item},
    )
    return item


def bump_sync(job_id: str, session: Session, item: int) -> int:
    """As :func:`bump_async`, for sync units."""
    session.execute(
        text("UPDATE chaos_counters SET n = n + 1 WHERE job = :job AND item = :item"),
        {"job": job_id, "item": item},
    )
    return item


async def _run_in_process(
    config: Config, job: Job, job_id: str, variant: tuple[str, str], out: Lines
) -> bool:
    """One run of a ``load`` or ``map`` job; whether it completed."""
    kind, driver = variant
    app, pool_size = config.app(job.name), job.limit + 2
    threads = kind.startswith("threads")
    options: dict[str, Any] = {"retry": _RETRY, "errors": "collect"}
    if kind.endswith("-batch"):
        options["batch"] = 20
    engine: Any
    if threads:
        engine = make_sync_engine(config, driver, app, pool_size, out)
        runner: Any = ThreadOffloadRunner(sessionmaker(engine), limit=job.limit, **options)
    else:
        engine = make_async_engine(config, driver, app, pool_size, out)
        sessions = async_sessionmaker(engine)
        if kind == "chunked":
            runner = ChunkedRunner(sessions, chunk_size=job.limit, **options)
        else:
            runner = SemaphoreRunner(sessions, limit=job.limit, **options)
    try:
        if job.kind == "load":
            try:
                report = await runner.load(
                    LOADED, _rows(job_id, job.size), batch=5000, journal=Journal(job_id)
                )
            except LoadFailed:
                return False
            return report.loaded + report.skipped == job.size and not report.rejected
        fn = functools.partial(bump_sync if threads else bump_async, job_id)
        result = await runner.map(fn, range(job.size), journal=Journal(job_id, key=int))
        return result.stats.succeeded + result.stats.skipped == job.size
    finally:
        await runner.aclose()
        if threads:
            engine.dispose()
        else:
            await engine.dispose()


async def _run_processes(config: Config, job: Job, job_id: str, variant: tuple[str, str]) -> bool:
    """One run of a ``processes`` job; whether it completed."""
    kind, driver = variant
    app = config.app(job.name)
    connect_args: dict[str, Any] = (
        {"server_settings": {"application_name": app}, "ssl": False, "timeout": 5}
        if driver == "asyncpg"
        else {"application_name": app, "connect_timeout": 5, "sslmode": "disable"}
    )
    options: dict[str, Any] = {"retry": _RETRY, "errors": "collect"}
    if kind.endswith("-batch"):
        options["batch"] = 20
    fn = functools.partial(bump_async if driver == "asyncpg" else bump_sync, job_id)
    # Its workers, spawned, inherit this and write down the connections they discard (the module's end).
    os.environ[_WORKER_DISCARDS] = json.dumps({"out": str(config.out), "app": app})
    async with ProcessRunner(
        proxied_url(config, driver), limit=job.limit, processes=2,
        engine_options={"connect_args": connect_args}, **options,
    ) as runner:  # fmt: skip
        result = await runner.map(fn, range(job.size), journal=Journal(job_id, key=int))
    return result.stats.succeeded + result.stats.skipped == job.size


def child(config: Config, job: Job, job_id: str) -> int:
    """One run of ``job_id``: 0 if it completed, :data:`INCOMPLETE` if not."""
    variants = VARIANTS[job.kind]
    variant = variants[int(job_id.rpartition("-")[2]) % len(variants)]
    discards = Lines(config.out, "discards", job.name)
    anomalies = Lines(config.out, "anomalies", job.name)
    logging.basicConfig(filename=config.out / f"{job.name}.log", level=logging.WARNING, format=_LOG_FORMAT)
    stacks = (config.out / f"{job.name}.stacks").open("a")  # SIGUSR1: every thread's stack, for a stuck run
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    async def main() -> bool:
        def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            anomalies.write(
                kind="asyncio-handler",
                job=job_id,
                detail=f"{context.get('message')}: {context.get('exception')!r}",
            )

        asyncio.get_running_loop().set_exception_handler(on_error)
        # SIGUSR2: every task's stack, for a run stuck awaiting something.
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks, stacks)
        if job.kind == "processes":
            return await _run_processes(config, job, job_id, variant)
        return await _run_in_process(config, job, job_id, variant, discards)

    try:
        completed = anyio.run(main)
    except Exception as error:
        # What stops a run is documented: a load's LoadFailed (caught above), and a map()'s journal
        # lookup that failed past the retry policy, with the driver's own error (guarantees.md, "With
        # a journal"). Anything else is a defect.
        if job.kind == "load" or not isinstance(error, _DRIVER_ERRORS):
            anomalies.write(
                kind="job-error", job=job_id, detail=f"{variant}: {type(error).__name__}: {error}"
            )
        completed = False
    finally:
        discards.close()
        anomalies.close()
    return 0 if completed else INCOMPLETE


def _dump_tasks(file: Any) -> None:
    """Write every task of the running loop, with the chain of coroutines it awaits, to ``file``."""
    for task in asyncio.all_tasks():
        print(f"Task {task.get_name()}:", file=file)
        coroutine: Any = task.get_coro()
        while coroutine is not None:
            frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "gi_frame", None)
            if frame is not None:
                print(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", file=file)
            coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)
    file.flush()


# -- the orchestrator's side ---------------------------------------------------------------------------------


class JobSupervisor:
    """Runs one job's child over and over, each job to completion, and checks it. See the module docstring."""

    def __init__(
        self,
        config: Config,
        job: Job,
        admin: Engine,
        anomalies: Lines,
        on_kill: Callable[[str, float], None],
    ) -> None:
        self.config = config
        self.job = job
        self._admin = admin
        self._anomalies = anomalies
        self._on_kill = on_kill
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.runs = self.kills = self.jobs_checked = self.units_checked = 0
        self._thread = threading.Thread(target=self._run, name=f"chaos-job-{job.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Let the job in progress complete (no more faults by now), check it, and end (:meth:`join`)."""
        self._stopping.set()

    def join(self, deadline: float) -> None:
        """Wait for the end until ``deadline`` (``time.monotonic()``): still running then is a finding."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._anomalies.write(
                kind="job-stuck", job=self.job.name, detail="not complete when the soak settled"
            )
            with self._lock:
                if self._process is not None:
                    self._process.send_signal(signal.SIGUSR1)  # its stacks, into <job>.stacks
            time.sleep(1)
            self.kill()

    def kill(self, rng: random.Random | None = None) -> bool:
        """SIGKILL the running child, if any; whether one was running."""
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                return False
            self._on_kill(self.config.app(self.job.name), time.time())
            process.send_signal(signal.SIGKILL)
            self.kills += 1
            return True

    def kill_worker(self, rng: random.Random) -> bool:
        """SIGKILL one worker process of a running ``processes`` child; whether there was one."""
        import psutil

        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                return False
            try:
                workers = psutil.Process(process.pid).children()
            except psutil.NoSuchProcess:
                return False
            if not workers:
                return False
            self._on_kill(self.config.app(self.job.name), time.time())
            with _suppress_gone():
                rng.choice(workers).send_signal(signal.SIGKILL)
            self.kills += 1
            return True

    def _run(self) -> None:
        for number in itertools.count():
            job_id = f"{self.job.name}-{number}"
            self._prepare(job_id)
            self._complete(job_id)
            self._check(job_id)
            if self._stopping.is_set():
                return

    def _prepare(self, job_id: str) -> None:
        if self.job.kind in ("map", "processes"):
            with self._admin.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO chaos_counters (job, item, n) "
                        "SELECT :job, g, 0 FROM generate_series(0, :n - 1) AS g"
                    ),
                    {"job": job_id, "n": self.job.size},
                )

    def _complete(self, job_id: str) -> None:
        command = [
            sys.executable,
            "-m",
            "tests.chaos.jobs",
            str(self.config.out / "config.json"),
            self.job.name,
            job_id,
        ]
        while True:
            with self._lock:
                self._process = subprocess.Popen(command, cwd=_ROOT)
            status = self._process.wait()
            with self._lock:
                self._process = None
            self.runs += 1
            if status == 0:
                return
            if status not in (INCOMPLETE, -signal.SIGKILL):
                self._anomalies.write(kind="job-crash", job=job_id, detail=f"exit status {status}")
            time.sleep(0.2)

    def _check(self, job_id: str) -> None:
        with self._admin.connect() as connection:
            if self.job.kind == "load":
                count, distinct, low, high = connection.execute(
                    text(
                        "SELECT count(*), count(DISTINCT i), min(i), max(i) "
                        "FROM chaos_loaded WHERE job = :job"
                    ),
                    {"job": job_id},
                ).one()
                if (count, distinct, low, high) != (self.job.size, self.job.size, 0, self.job.size - 1):
                    self._anomalies.write(
                        kind="load-not-once", job=job_id,
                        detail=f"{count} rows, {distinct} distinct of {self.job.size} (i {low}..{high})",
                    )  # fmt: skip
                connection.execute(text("DELETE FROM chaos_loaded WHERE job = :job"), {"job": job_id})
            else:
                wrong = connection.execute(
                    text(
                        "SELECT item, n FROM chaos_counters WHERE job = :job AND n <> 1 ORDER BY item LIMIT 5"
                    ),
                    {"job": job_id},
                ).all()
                if wrong:
                    count = connection.execute(
                        text("SELECT count(*) FROM chaos_counters WHERE job = :job AND n <> 1"),
                        {"job": job_id},
                    ).scalar_one()
                    self._anomalies.write(
                        kind="map-not-once", job=job_id,
                        detail=f"{count} of {self.job.size} items' counters not 1, e.g. {wrong}",
                    )  # fmt: skip
            connection.commit()
        self.jobs_checked += 1
        self.units_checked += self.job.size


_ROOT = Path(__file__).resolve().parents[2]


class _suppress_gone:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        import psutil

        return kind is not None and issubclass(kind, psutil.NoSuchProcess)


def _watch_worker_discards() -> None:
    """In a ProcessRunner worker of a ``processes`` job: write down every connection its pools discard."""
    spec = os.environ.get(_WORKER_DISCARDS)
    if spec:
        where = json.loads(spec)
        # One file for all workers: each line is one append (O_APPEND), whole, whichever process writes it.
        watch_discards(Pool, where["app"], Lines(Path(where["out"]), "discards", f"{where['app']}-workers"))


if __name__ == "__mp_main__":  # a ProcessRunner's worker, spawned: it runs this module under that name
    _watch_worker_discards()

if __name__ == "__main__":
    _config = Config.load(Path(sys.argv[1]))
    _job = next(job for job in _config.jobs if job.name == sys.argv[2])
    sys.exit(child(_config, _job, sys.argv[3]))
