"""The worker side of a ProcessRunner: a process or a Dask task running units with an in-process runner."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from .._arguments import check_retry
from .._core.attempts import Attempts, CommitUnknown, CommitVerified
from .._dialects import for_name
from .._errors import WorkerLostError
from .._executors.checkouts import track_peak
from .._executors.verify import CommitVerifier
from .._runners.journal_rows import JournalRows
from .._runners.semaphore import SemaphoreRunner
from .._runners.thread_offload import ThreadOffloadRunner
from .._telemetry import attached
from . import protocol as p
from .protocol import Kind, WorkerConfig
from .worker_call import Gate, WorkerCall

__all__ = ["main", "serve"]


def main(connection: Connection, config: WorkerConfig, marks: Any | None) -> None:
    """Serve as a local worker process until the parent says exit or goes away. ``marks`` is shared."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it cancels what runs here
    serve(connection, config, None if marks is None else memoryview(marks).cast("B"))


def serve(connection: Connection, config: WorkerConfig, marks: memoryview | None = None) -> None:
    """Serve over ``connection`` in this thread, on an event loop of its own. See ``protocol`` for marks."""
    try:
        asyncio.run(WorkerSide(connection, config, marks).serve())
    finally:
        _hang_up(connection)


def _hang_up(connection: Connection) -> None:
    """
    Close both ways of the pipe, so that the parent reads its end at once.

    Closing alone would not: the reader thread's ``recv`` holds the socket open until it returns,
    which, in a Dask task whose process goes on, is never.
    """
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(connection.fileno())) as duplicate:
        duplicate.shutdown(socket.SHUT_RDWR)
    connection.close()


class WorkerSide:
    """One worker: an engine built once per kind of function, its gate, and the calls it serves."""

    def __init__(self, connection: Connection, config: WorkerConfig, marks: memoryview | None) -> None:
        self._connection = connection
        self._config = config
        self.marks = marks
        self._send_lock = threading.Lock()
        #: Messages to send with the next write; see ``post()``.
        self._posted: list[tuple[Any, ...]] = []
        self._calls: dict[int, WorkerCall] = {}
        self._engines: dict[Kind, Engine | AsyncEngine] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._dialect = for_name(config.url.get_dialect().name)
        self.xid_sql = self._dialect.current_xid_sql if config.verify_commits else None
        self.gate = Gate(config.units, self._dispose)
        #: Each journal's rows that calls looked keys up in, by kind and ``(job, table, create_table)``.
        self._lookups: dict[tuple[Kind, tuple[str, str, bool]], JournalRows] = {}
        #: The retry rule of the worker's runners, which a journal's lookups are tried by too.
        self._attempts = Attempts(check_retry(config.retry))

    def send(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` to the parent after what was posted, from any thread: in the pipe on return."""
        with self._send_lock:
            self._posted.append(message)
            self._write()

    def post(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` soon: with the next message sent, or at the end of the loop's turn."""
        with self._send_lock:
            self._posted.append(message)
            if len(self._posted) == 1:
                if threading.get_ident() == self._loop_thread:
                    self._loop.call_soon(self._flush_soon)
                else:
                    self._loop.call_soon_threadsafe(self._flush_soon)

    def _flush_soon(self) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: the reader ends the worker
            self.flush()

    def flush(self) -> None:
        """Send what was posted now, from any thread."""
        with self._send_lock:
            if self._posted:
                self._write()

    def _write(self) -> None:
        """One write of every message posted, in order, as one list. Under the send lock."""
        data = pickle.dumps(self._posted, pickle.HIGHEST_PROTOCOL)
        self._posted = []
        self._connection.send_bytes(data)

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._done = asyncio.Event()
        threading.Thread(target=self._read, name="boundeddb-worker-reader", daemon=True).start()
        self.send(p.Ready(os.getpid()))
        try:
            await self._done.wait()
        finally:
            for call in list(self._calls.values()):
                call.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            for kind in list(self._engines):
                await self._dispose(kind)

    def _read(self) -> None:
        """In a thread: hand each message from the parent to the loop, and the end of the pipe."""
        try:
            while True:
                message = pickle.loads(self._connection.recv_bytes())
                self._loop.call_soon_threadsafe(self._on_message, message)
        except (EOFError, OSError):
            pass
        with contextlib.suppress(RuntimeError):  # the loop is closed: we are done already
            self._loop.call_soon_threadsafe(self._done.set)

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_message(self, message: Any) -> None:
        kind = type(message)
        if kind is p.Units:
            call = self._calls.get(message.call)
            if call is None:  # refused or finished: give them back
                self.send(p.Returned(message.call, [index for index, _, _ in message.units]))
            else:
                call.add(message.units)
        elif kind is p.CallBegins:
            call = WorkerCall(
                self, message.call, Kind(message.kind), message.fn, message.carrier, message.journal
            )
            self._calls[message.call] = call
            call.task = self._spawn(self._run(call))
        elif kind is p.Close or kind is p.Stop or kind is p.Cancel:
            call = self._calls.get(message.call)
            if call is not None:
                (call.close if kind is p.Close else call.stop if kind is p.Stop else call.cancel)()
        elif kind is p.Verify:
            self._spawn(self._verify(Kind(message.kind), message.requests))
        elif kind is p.LookUp:
            self._spawn(self._look_up(message))
        elif kind is p.Exit:
            self._done.set()

    # -- engines and runners ---------------------------------------------------------------------

    def _engine(self, kind: Kind) -> Engine | AsyncEngine:
        engine = self._engines.get(kind)
        if engine is None:
            options = dict(self._config.engine_options)
            if "poolclass" not in options:  # exactly this worker's share, never more
                options.update(pool_size=self._config.share, max_overflow=0)
            create: Callable[..., Any] = create_async_engine if kind is Kind.ASYNC else create_engine
            engine = self._engines[kind] = create(self._config.url, **options)
        return engine

    async def _dispose(self, kind: Kind) -> None:
        engine = self._engines.get(kind)
        if isinstance(engine, AsyncEngine):
            await engine.dispose()
        elif engine is not None:
            await asyncio.to_thread(engine.dispose)

    def _runner(self, kind: Kind, engine: Engine | AsyncEngine) -> SemaphoreRunner | ThreadOffloadRunner:
        config = self._config
        options: dict[str, Any] = {
            "limit": config.share,
            "errors": "collect",
            "retry": config.retry,
            "timeout": config.timeout,
            "verify_commits": config.verify_commits,
            "batch": config.batch,
        }
        if isinstance(engine, AsyncEngine):
            return SemaphoreRunner(async_sessionmaker(engine), **options)
        return ThreadOffloadRunner(sessionmaker(engine), **options)

    async def _run(self, call: WorkerCall) -> None:
        """Run a call's units as they come, until the parent closes, stops or cancels it."""
        call.running = True
        peak = batches_committed = units_rerun = 0
        try:
            try:
                call.fn = pickle.loads(call.fn_bytes)
                engine = self._engine(call.kind)
                runner = self._runner(call.kind, engine)
                if call.journal is not None:  # the parent looked the keys up and made the table
                    job, table = call.journal
                    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
                    call.rows = JournalRows(
                        job,
                        table,
                        sync_engine,
                        self._dialect,
                        self._attempts,
                        async_units=call.kind is Kind.ASYNC,
                        create_table=False,
                    )
            except Exception as error:
                call.stop()
                data, text_ = p.dump_error(error, -1)
                self.send(p.CallFailed(call.id, data, text_))
                return
            peaks = track_peak(engine.pool if isinstance(engine, Engine) else engine.sync_engine.pool)
            try:
                with attached(call.carrier):  # the caller's span is this call's units' parent
                    await runner._feed(call.units(), call.settled)
            finally:
                peak = peaks.peak
                peaks.close()
                figures = runner.statistics()
                batches_committed, units_rerun = figures.batches_committed, figures.units_rerun
        except asyncio.CancelledError:
            pass  # cancelled by the parent: the units in flight were rolled back
        finally:
            call.return_queued()
            self.gate.release(call.held)
            call.held = 0
            self._calls.pop(call.id, None)
            with contextlib.suppress(OSError):
                self.send(p.Closed(call.id, peak, call.peak_held, batches_committed, units_rerun))

    # -- a call's journal lookups, on this worker's share of the limit ----------------------------

    def _journal_rows(self, kind: Kind, journal: tuple[str, str, bool]) -> JournalRows:
        """The rows of a journal, on ``kind``'s engine: made once, so that its table is checked once."""
        rows = self._lookups.get((kind, journal))
        if rows is None:
            engine = self._engine(kind)
            sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
            job, table, create_table = journal
            rows = self._lookups[kind, journal] = JournalRows(
                job,
                table,
                sync_engine,
                self._dialect,
                self._attempts,
                async_units=kind is Kind.ASYNC,
                create_table=create_table,
            )
        return rows

    async def _look_up(self, message: p.LookUp) -> None:
        """
        Which of a call's keys have a row, within one place of the gate: the parent has no connection.
        The lookup is retried as the worker's units are, keeping its place meanwhile as a unit does.
        """
        kind = Kind(message.kind)
        await self.gate.acquire(kind)
        try:
            done = await self._journal_rows(kind, message.journal).done(message.keys)
        except Exception as error:  # the table missing with create_table=False, say: the call's error
            data, text_ = p.dump_error(error, -1)
            self.send(p.LookedUp(message.request, [], data, text_))
        else:
            self.send(p.LookedUp(message.request, list(done)))
        finally:
            self.gate.release()

    # -- what became of a COMMIT when the worker sending it died ---------------------------------

    async def _verify(self, kind: Kind, requests: list[tuple[int, int, str]]) -> None:
        """Ask the server about each COMMIT a dead worker had begun, within one place of the gate."""
        engine = self._engine(kind)
        sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
        verifier = CommitVerifier(sync_engine, self._dialect)
        await self.gate.acquire(kind)
        try:
            for call, index, xid in requests:
                unknown = CommitUnknown(WorkerLostError("the worker committing it died"), xid)
                status = "unknown"
                try:
                    if kind is Kind.ASYNC:
                        await verifier.resolve_async(unknown, index)
                    else:
                        await asyncio.to_thread(verifier.resolve_sync, unknown, index, lambda: False)
                except CommitVerified as verdict:
                    status = "committed" if verdict.committed else "aborted"
                except Exception:  # CommitUnknown, or no connection to ask on
                    status = "unknown"
                self.send(p.Verified(call, index, status))
        finally:
            self.gate.release()
