"""How a ProcessRunner's workers are started and reached: local processes, or tasks on a Dask cluster."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import secrets
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from .._errors import WorkerStartError
from . import worker
from .callback import CallbackListener, Channel, connect
from .protocol import WorkerConfig, most_handed

if TYPE_CHECKING:
    import ssl
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


def _listen_tls(client: Any) -> ssl.SSLContext | None:
    """This process's TLS for the callback port: the Dask client's certificates, or None without TLS."""
    security = getattr(client, "security", None)
    if security is None:
        return None
    context: ssl.SSLContext | None = security.get_listen_args("client")["ssl_context"]
    return context


def _worker_tls() -> ssl.SSLContext:
    """A Dask task's TLS to connect back with: its worker's own certificates, as for its other peers."""
    from distributed import get_worker  # boundeddb[dask]: imported only in a Dask task

    security: Any = get_worker().security
    context: ssl.SSLContext | None = security.get_connection_args("worker")["ssl_context"]
    if context is None:
        msg = (
            "the runner's callback uses TLS, as its Dask client does, but this Dask worker has no TLS "
            "certificate (distributed.security.Security, role 'worker'): give them the cluster's certificates"
        )
        raise RuntimeError(msg)
    return context


def serve_dask(address: tuple[str, int], authkey: bytes, token: str, tls: bool) -> None:
    """
    A Dask task: connect back to the runner and serve as one of its workers until told to exit.

    Its settings, the database URL with its password among them, come over that connection, in TLS
    when the runner's is: never as the task's arguments, which go through the scheduler.
    """
    connection = connect(address, authkey, _worker_tls() if tls else None)
    connection.send_bytes(token.encode())
    try:
        config = pickle.loads(connection.recv_bytes())  # from the runner: it proved the key
    except EOFError:  # Dask ran the task again after its worker died: the runner no longer waits for it
        connection.close()
        return
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
    """
    Workers as long-running tasks on a Dask cluster's workers, each connecting back to this process.

    They connect to a callback port on this host's interface toward the scheduler, in TLS when the
    Dask client uses TLS, and prove that they know a key of 32 random bytes made for this runner.
    """

    noun = "Dask task"

    def __init__(self, client: Any) -> None:
        self._client = client
        self._authkey = secrets.token_bytes(32)
        self._waiting: dict[str, queue.SimpleQueue[Connection]] = {}
        self._lock = threading.Lock()
        context = _listen_tls(client)
        self._tls = context is not None
        host = _reachable_host(client.scheduler.address)
        self._callback = CallbackListener(host, self._authkey, context, self._arrived)
        self._address = self._callback.address

    def _workers(self) -> list[str]:
        return sorted(self._client.scheduler_info()["workers"])

    def default_workers(self) -> int:
        return max(1, len(self._workers()))

    def _arrived(self, token: bytes, connection: Channel) -> None:
        """A task connected back and proved the key: hand its connection to the start that waits for it."""
        with self._lock:
            waiting = self._waiting.pop(token.decode(errors="replace"), None)
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
            self._tls,
            key=f"boundeddb-worker-{number}-{token}",
            pure=False,
            workers=[where],
            allow_other_workers=False,  # spread over the workers, and a dead one is replaced elsewhere
        )
        deadline = time.monotonic() + DASK_CONNECT_TIMEOUT_S
        try:
            while True:
                try:
                    connection = arrived.get(timeout=0.1)
                except queue.Empty:
                    pass
                else:  # the settings go over the connection, never through the scheduler
                    connection.send_bytes(pickle.dumps(config, pickle.HIGHEST_PROTOCOL))
                    return _DaskHandle(future, connection, where)
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
        self._callback.close()
