"""
The soak's client process: every in-process workload at once, on one asyncio loop, through the proxies.

``python -m tests.chaos.clients CONFIG`` runs until the file ``<run>/stop`` appears, then lets every
caller finish the operation it is in and exits. Each operation is written to ``ops-clients-*.jsonl``
with its class (:func:`~tests.chaos.records.classify`); each connection a pool discards, to
``discards-*.jsonl``; what goes wrong beside the operations (a bank total that moved, an error of a
kind no fault explains, anything asyncio's exception handler is given), to ``anomalies-*.jsonl``.

The workloads (:data:`WORKLOADS`): ``submit()`` storms on asyncpg, psycopg 3 async and
``ThreadOffloadRunner`` over psycopg 3, with timeouts, retries, ``verify_commits`` and callers
cancelled at random; the same with ``batch=``; a bank whose total must never change; ``submit()``
on MariaDB (aiomysql, pymysql) where it answers; and, only when asked, ``wrong-retry``: a
hand-written client that retries after a lost COMMIT reply without asking the server, which the
checker must catch writing twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import itertools
import logging
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import (
    BatchPolicy,
    Outcome,
    RetryPolicy,
    SemaphoreRunner,
    ThreadOffloadRunner,
    UnitMisuseError,
)
from tests.chaos.config import Config, Workload
from tests.chaos.engines import make_async_engine, make_sync_engine
from tests.chaos.records import Lines, classify

__all__ = ["main"]

#: Error types that no fault explains: a defect of the library (or of the soak) whenever one is raised.
_DEFECTS = (AssertionError, AttributeError, IndexError, KeyError, NameError, TypeError, UnitMisuseError)

INSERT_PG = text("INSERT INTO chaos_writes (op) VALUES (:op)")
INSERT_MY = text("INSERT INTO chaos_writes (op) VALUES (:op)")


class Recorder:
    """The client process's three files, and its asyncio loop's exception handler."""

    def __init__(self, out: Path) -> None:
        self.ops = Lines(out, "ops", "clients")
        self.discards = Lines(out, "discards", "clients")
        self.anomalies = Lines(out, "anomalies", "clients")

    def on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.anomalies.write(
            kind="asyncio-handler", detail=f"{context.get('message')}: {context.get('exception')!r}"
        )

    def close(self) -> None:
        for lines in (self.ops, self.discards, self.anomalies):
            lines.close()


# -- one caller's operation ----------------------------------------------------------------------------


@dataclasses.dataclass
class Caller:
    """What a workload's callers share: its name, runner, unit maker, and the chances of its faults."""

    workload: Workload
    runner: Any
    make_unit: Callable[[str, float], Any]
    rng: random.Random
    recorder: Recorder
    counter: itertools.count[int] = dataclasses.field(default_factory=itertools.count)

    async def one(self) -> None:
        """Issue one operation, perhaps cancelled, and write it down with its class."""
        spec, rng = self.workload, self.rng
        op = f"{spec.name}:{next(self.counter)}"
        sleep = rng.uniform(0.2, spec.timeout + 1) if rng.random() < spec.slow else 0.0
        unit = self.make_unit(op, sleep)
        outcomes: list[Outcome[Any]] = []
        cancel = rng.uniform(0.0, 0.3) if rng.random() < spec.cancel else None
        started = time.time()
        returned, error, how = False, None, "submit"
        try:
            if cancel is not None and rng.random() < 0.5:
                how = "cancel-scope"
                with anyio.CancelScope(deadline=anyio.current_time() + cancel):
                    await self.runner.submit(unit, on_outcome=outcomes.append)
                    returned = True
            elif cancel is not None:
                how = "task-cancel"
                task = asyncio.ensure_future(self.runner.submit(unit, on_outcome=outcomes.append))
                await asyncio.wait((task,), timeout=cancel)
                task.cancel()
                try:
                    await task
                    returned = True
                except asyncio.CancelledError:
                    if not task.cancelled():
                        raise
            else:
                await self.runner.submit(unit, on_outcome=outcomes.append)
                returned = True
        except Exception as raised:
            error = raised
        cls, why = classify(returned, outcomes[-1] if outcomes else None)
        if error is not None:
            why = f"{why}; raised {type(error).__name__}"
            if isinstance(error, _DEFECTS):
                self.recorder.anomalies.write(
                    kind="defect-error", op=op, detail=f"{type(error).__name__}: {error}"
                )
        elif not returned:
            why = f"{why}; cancelled ({how})"
        self.recorder.ops.write(op=op, workload=spec.name, cls=cls, why=why, start=started, slow=sleep)

    async def loop(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            await self.one()


# -- units ---------------------------------------------------------------------------------------------


def pg_async_unit(op: str, sleep: float) -> Any:
    async def unit(session: Any) -> str:
        if sleep:
            await session.execute(text("SELECT pg_sleep(:s)"), {"s": sleep})
        await session.execute(INSERT_PG, {"op": op})
        return op

    return unit


def pg_sync_unit(op: str, sleep: float) -> Any:
    def unit(session: Session) -> str:
        if sleep:
            session.execute(text("SELECT pg_sleep(:s)"), {"s": sleep})
        session.execute(INSERT_PG, {"op": op})
        return op

    return unit


def my_async_unit(op: str, sleep: float) -> Any:
    async def unit(session: Any) -> str:
        if sleep:
            await session.execute(text("SELECT SLEEP(:s)"), {"s": sleep})
        await session.execute(INSERT_MY, {"op": op})
        return op

    return unit


def my_sync_unit(op: str, sleep: float) -> Any:
    def unit(session: Session) -> str:
        if sleep:
            session.execute(text("SELECT SLEEP(:s)"), {"s": sleep})
        session.execute(INSERT_MY, {"op": op})
        return op

    return unit


# -- the bank ------------------------------------------------------------------------------------------


def transfer_unit(op: str, rng: random.Random, accounts: int) -> Any:
    """Move an amount between two accounts and write the transfer down, in one transaction."""
    source, target = rng.sample(range(accounts), 2)
    amount = rng.randint(1, 50)

    async def unit(session: Any) -> str:
        await session.execute(
            text("UPDATE chaos_accounts SET balance = balance - :a WHERE id = :s"), {"a": amount, "s": source}
        )
        await session.execute(
            text("UPDATE chaos_accounts SET balance = balance + :a WHERE id = :t"), {"a": amount, "t": target}
        )
        await session.execute(
            text("INSERT INTO chaos_transfers (op, source, target, amount) VALUES (:op, :s, :t, :a)"),
            {"op": op, "s": source, "t": target, "a": amount},
        )
        return op

    return unit


async def audit_forever(runner: Any, config: Config, recorder: Recorder, stop: anyio.Event) -> None:
    """Read the bank's total every 200 ms: any read that sees another total is an anomaly."""

    async def total(session: Any) -> tuple[int, int]:
        row = (await session.execute(text("SELECT sum(balance), count(*) FROM chaos_accounts"))).one()
        return int(row[0]), int(row[1])

    reads = 0
    while not stop.is_set():
        try:
            seen, accounts = await runner.submit(total)
        except Exception:
            pass  # a fault: no read
        else:
            reads += 1
            if (seen, accounts) != (config.bank_total, config.bank_accounts):
                recorder.anomalies.write(
                    kind="bank-total", detail=f"read {seen} over {accounts} accounts, not {config.bank_total}"
                )
        await anyio.sleep(0.2)
    recorder.anomalies.write(kind="note", detail=f"bank reads: {reads}")


# -- a wrong client, for the checker's own test -----------------------------------------------------------


async def wrong_retry_loop(engine: AsyncEngine, name: str, recorder: Recorder, stop: anyio.Event) -> None:
    """Insert a row per operation, retrying any lost connection, even in COMMIT, without asking: wrong."""
    sessions = async_sessionmaker(engine)
    for n in itertools.count():
        if stop.is_set():
            return
        op = f"{name}:{n}"
        started = time.time()
        for _ in range(5):
            try:
                async with sessions.begin() as session:
                    await session.execute(INSERT_PG, {"op": op})
            except (sa_exc.DBAPIError, OSError):
                await anyio.sleep(0.05)
                continue
            recorder.ops.write(op=op, workload=name, cls="ok", why="committed", start=started, slow=0)
            break
        else:
            recorder.ops.write(op=op, workload=name, cls="fail", why="gave up", start=started, slow=0)


# -- the process ---------------------------------------------------------------------------------------


def make_runner(config: Config, workload: Workload, recorder: Recorder) -> tuple[Any, Any]:
    """The workload's runner, and its engine (to dispose of at the end)."""
    options: dict[str, Any] = {
        "limit": workload.limit,
        "retry": RetryPolicy(attempts=workload.attempts, max_delay=1.0),
        "errors": "collect",
    }
    if workload.timeout:
        options["timeout"] = workload.timeout
    if workload.batch:
        options["batch"] = BatchPolicy(workload.batch, linger=0.005)
    if workload.verify:
        options["verify_commits"] = True
    # MariaDB's connections are told apart by their database, PostgreSQL's by application_name. The
    # pool is larger than the runner's limit: the limit is the bound that the sampler checks.
    app = f"mysql:{config.mysql_database}" if workload.mysql else config.app(workload.name)
    pool_size = workload.limit + 4
    if workload.threads:
        engine: Any = make_sync_engine(config, workload.driver, app, pool_size, recorder.discards)
        return ThreadOffloadRunner(sessionmaker(engine), **options), engine
    engine = make_async_engine(config, workload.driver, app, pool_size, recorder.discards)
    return SemaphoreRunner(async_sessionmaker(engine), **options), engine


def unit_maker(workload: Workload) -> Callable[[str, float], Any]:
    mysql = workload.mysql
    if workload.threads:
        return my_sync_unit if mysql else pg_sync_unit
    return my_async_unit if mysql else pg_async_unit


async def run_clients(config: Config) -> None:
    recorder = Recorder(config.out)
    asyncio.get_running_loop().set_exception_handler(recorder.on_loop_error)
    stop = anyio.Event()
    engines: list[Any] = []
    runners: list[Any] = []
    rng = random.Random(config.seed)
    try:
        async with anyio.create_task_group() as group:
            for workload in config.workloads:
                if workload.kind == "wrong-retry":
                    app = config.app(workload.name)
                    engine = make_async_engine(
                        config, workload.driver, app, workload.limit, recorder.discards
                    )
                    engines.append(engine)
                    group.start_soon(wrong_retry_loop, engine, workload.name, recorder, stop)
                    continue
                runner, engine = make_runner(config, workload, recorder)
                engines.append(engine)
                runners.append(runner)
                worker_rng = random.Random(rng.random())
                if workload.kind == "bank":
                    bank_rng = random.Random(rng.random())
                    caller = Caller(
                        workload, runner,
                        lambda op, _sleep, r=bank_rng: transfer_unit(op, r, config.bank_accounts),
                        worker_rng, recorder,
                    )  # fmt: skip
                    group.start_soon(audit_forever, runner, config, recorder, stop)
                else:
                    caller = Caller(workload, runner, unit_maker(workload), worker_rng, recorder)
                for _ in range(workload.callers):
                    group.start_soon(caller.loop, stop)
            group.start_soon(_wait_for_stop, config.out / "stop", stop)
    finally:
        for runner in runners:
            await _close(runner)
        for engine in engines:
            if isinstance(engine, AsyncEngine):
                await engine.dispose()
            else:
                engine.dispose()
        recorder.close()


async def _close(runner: Any) -> None:
    aclose: Callable[[], Awaitable[None]] | None = getattr(runner, "aclose", None)
    if aclose is not None:
        await aclose()


async def _wait_for_stop(path: Path, stop: anyio.Event) -> None:
    """Set ``stop`` once the orchestrator has made the file ``path`` (checked every 100 ms)."""
    while not await anyio.Path(path).exists():  # noqa: ASYNC110 -- another process's signal
        await anyio.sleep(0.1)
    stop.set()


def main(argv: list[str]) -> None:
    config = Config.load(Path(argv[0]))
    logging.basicConfig(
        filename=config.out / "clients.log", level=logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )  # fmt: skip
    # Each verify_commits verdict on a lost COMMIT ("committed", "aborted"), with its time: what a
    # cancelled call's history is read against (seed 505's one anomaly went unexplained without it).
    logging.getLogger("boundeddb.verify").setLevel(logging.INFO)
    stacks = (config.out / "clients.stacks").open("a")  # SIGUSR1: every thread's stack, if it is stuck
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    asyncio.run(run_clients(config))


if __name__ == "__main__":
    main(sys.argv[1:])
