"""How a ProcessRunner's workers are started and reached: local processes, or tasks on a Dask cluster."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import secrets
import signal
import socket
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from .._errors import WorkerStartError
from . import worker
from .protocol import WorkerConfig, most_handed

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

__all__ = ["Backend", "DaskCluster", "LocalProcesses", "WorkerHandle"]

#: How many seconds a Dask task may take to connect back before its start counts as failed.
DASK_CONNECT_TIMEOUT_S = 60.0


class WorkerHandle(Protocol):
    """One worker as started: the pipe to it, its marks, and how to end it."""

    connection: Connection
    #: The worker's unit marks, described in ``protocol``, in memory both processes share. None where
    #: the worker may be on another host: it then says each mark in a message.
    marks: memoryview | None

    def kill(self) -> None:
        """End the worker now. Its connections close with it."""

    def wait(self, timeout: float) -> bool:
        """Wait for the worker to end, at most ``timeout`` seconds: whether it has."""

    def describe_end(self) -> str:
        """How the worker ended, for messages: "killed by SIGKILL", "exited with code 1"."""


class Backend(Protocol):
    """Starts workers. Each call blocks until the worker's pipe is open, not until it is ready."""

    #: For messages: "worker process", "Dask task".
    noun: str

    def default_workers(self) -> int:
        """How many workers to start when the caller does not say: the cores, or the cluster's workers."""

    def start(self, number: int, config: WorkerConfig) -> WorkerHandle: ...

    def close(self) -> None: ...


# -- local processes ------------------------------------------------------------------------------


class _LocalHandle:
    def __init__(self, process: BaseProcess, connection: Connection, marks: memoryview | None) -> None:
        self.process = process
        self.connection = connection
        self.marks: memoryview | None = marks

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout: float) -> bool:
        self.process.join(timeout)
        return self.process.exitcode is not None

    def describe_end(self) -> str:
        code = self.process.exitcode
        if code is None:
            return f"its pipe closed (pid {self.process.pid})"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"it was killed by {name} (pid {self.process.pid})"
        return f"it exited with code {code} (pid {self.process.pid})"


class LocalProcesses:
    """Workers as child processes of this one, started with ``spawn`` or ``forkserver``: nothing forked."""

    noun = "worker process"
    #: Whether workers mark their units in shared memory. Tests turn it off: by message, as on Dask.
    share_marks = True

    def __init__(self, method: str = "spawn") -> None:
        self._context = multiprocessing.get_context(method)

    def default_workers(self) -> int:
        affinity = getattr(os, "sched_getaffinity", None)
        return len(affinity(0)) if affinity is not None else os.cpu_count() or 1

    def start(self, number: int, config: WorkerConfig) -> _LocalHandle:
        ours, theirs = self._context.Pipe(duplex=True)
        # Shared memory handed over at spawn, with no name to leak: the child's stores are visible here.
        shared = self._context.RawArray("B", most_handed(config.units)) if self.share_marks else None
        process = self._context.Process(  # type: ignore[attr-defined]
            target=worker.main, args=(theirs, config, shared), name=f"boundeddb-worker-{number}", daemon=True
        )
        process.start()
        theirs.close()
        return _LocalHandle(process, ours, None if shared is None else memoryview(shared).cast("B"))

    def close(self) -> None:
        pass


# -- a Dask cluster ---------------------------------------------------------------------------------


def _reachable_host(scheduler_address: str) -> str:
    """This host's address on the route to the scheduler, where the cluster's workers can reach us."""
    parsed = urlsplit(scheduler_address)
    host = parsed.hostname or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, parsed.port or 8786))  # no packet is sent
        address: str = probe.getsockname()[0]
        return address


def _no_delay(connection: Connection) -> None:
    """
    Send each message of a TCP connection at once, with ``TCP_NODELAY``.

    Else Nagle's algorithm holds a small message back until the previous one is acknowledged,
    which the peer delays up to 40 ms: the workers would wait for units, and the parent for outcomes.
    """
    with socket.socket(fileno=os.dup(connection.fileno())) as duplicate:  # options are the socket's
        duplicate.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def serve_dask(address: tuple[str, int], authkey: bytes, token: str, config: WorkerConfig) -> None:
    """A Dask task: connect back to the runner and serve as one of its workers until told to exit."""
    connection = Client(address, authkey=authkey)
    _no_delay(connection)
    connection.send_bytes(token.encode())
    worker.serve(connection, config)


class _DaskHandle:
    def __init__(self, future: Any, connection: Connection, where: str) -> None:
        self.future = future
        self.connection = connection
        self.where = where
        self.marks: memoryview | None = None

    def kill(self) -> None:
        self.connection.close()  # the task sees its pipe end: it cancels its units and returns

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.future.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        return bool(self.future.done())

    def describe_end(self) -> str:
        return f"its Dask worker ({self.where}) or the task on it was lost (task {self.future.status})"


class DaskCluster:
    """Workers as long-running tasks on a Dask cluster's workers, each connecting back to this process."""

    noun = "Dask task"

    def __init__(self, client: Any) -> None:
        self._client = client
        self._authkey = secrets.token_bytes(32)
        host = _reachable_host(client.scheduler.address)
        self._listener = Listener((host, 0), authkey=self._authkey)
        self._address: tuple[str, int] = self._listener.address
        self._waiting: dict[str, queue.SimpleQueue[Connection]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, name="boundeddb-dask-accept", daemon=True)
        self._accepting.start()

    def _workers(self) -> list[str]:
        return sorted(self._client.scheduler_info()["workers"])

    def default_workers(self) -> int:
        return max(1, len(self._workers()))

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection = self._listener.accept()
            except Exception:  # a peer that failed the handshake, or close()'s poke
                continue
            try:
                _no_delay(connection)
                token = connection.recv_bytes().decode()
            except (EOFError, OSError):
                continue
            with self._lock:
                waiting = self._waiting.pop(token, None)
            if waiting is None:
                connection.close()  # a task Dask ran again after its worker died: not ours any more
            else:
                waiting.put(connection)

    def start(self, number: int, config: WorkerConfig) -> _DaskHandle:
        workers = self._workers()
        if not workers:
            raise WorkerStartError("the Dask cluster has no workers: start some, or pass cluster=None")
        where = workers[number % len(workers)]
        token = secrets.token_hex(16)
        arrived: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        with self._lock:
            self._waiting[token] = arrived
        future = self._client.submit(
            serve_dask,
            self._address,
            self._authkey,
            token,
            config,
            key=f"boundeddb-worker-{number}-{token}",
            pure=False,
            workers=[where],
            allow_other_workers=False,  # spread over the workers, and a dead one is replaced elsewhere
        )
        deadline = time.monotonic() + DASK_CONNECT_TIMEOUT_S
        try:
            while True:
                try:
                    return _DaskHandle(future, arrived.get(timeout=0.1), where)
                except queue.Empty:
                    pass
                if future.done() or time.monotonic() > deadline:
                    error = future.exception() if future.status == "error" else None
                    msg = f"the Dask task of worker {number} ended before it connected back ({future.status})"
                    if error is None and not future.done():
                        msg = (
                            f"the Dask task of worker {number} did not connect back "
                            f"within {DASK_CONNECT_TIMEOUT_S} s"
                        )
                        future.cancel()
                    raise WorkerStartError(msg) from error
        finally:
            with self._lock:
                self._waiting.pop(token, None)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):  # wake the accepting thread: closing alone does not
            socket.create_connection(self._address, timeout=1.0).close()
        self._accepting.join(5.0)
        self._listener.close()
