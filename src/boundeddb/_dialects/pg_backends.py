"""
PostgreSQL backends of discarded connections, ended with ``pg_terminate_backend`` from a side connection.

A backend does not notice that its client closed the socket while it runs a statement (a
``pg_sleep``, a lock wait, a long query), nor, behind a half-open connection, while it waits for the
next one with its transaction open. A cancel request does not cover it either: one that overtakes
its statement on the way to the server is dropped. So when a pool discards a connection, the backend
is terminated, which also rolls back its transaction.

Which backend: the pid the driver got at connect (its cancel key's) and the backend's start time,
read at connect, both from ``pg_stat_activity`` of ``pg_backend_pid()``. A pid alone could name
another backend by the time the side connection asks. Where the driver's pid is not the server's
(PgBouncer and other poolers hand out their own, and share the server's backends between clients),
or the driver does not tell it, nothing is ever terminated.

The side connection is opened from the engine's URL with the driver's own connect arguments, as
``application_name`` ``boundeddb-end``, outside the pool and its bound; ``connect_args`` given to
``create_engine()`` are not known here. ``docs/explanation/architecture.md`` has the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .enders import END_WAIT_S, More

__all__ = [
    "IDENTITY_SQL",
    "SIDE_APPLICATION",
    "BackendId",
    "SideTarget",
    "driver_pid",
    "end_backends",
    "side_target",
]

logger = logging.getLogger("boundeddb.dialects")

#: The ``application_name`` of the side connection, so that it is told apart in ``pg_stat_activity``.
SIDE_APPLICATION = "boundeddb-end"
#: Seconds the side connection may take to open.
_CONNECT_S = 2
#: How often, in seconds, the side connection asks whether the backends have ended.
_POLL_S = 0.005
#: Seconds between attempts to open the side connection.
_RETRY_S = 0.1
#: The most seconds one query of the side connection may take (they take milliseconds): a link frozen
#: under it then costs another connection, not the whole wait, within the second a backend may run on.
_QUERY_S = 0.5
#: The most seconds one of its queries may take on asyncpg (they take milliseconds).
_QUERY_S = 1.5
#: A backend's start, as microseconds since 1970: an integer, whatever the session's settings.
_STARTED = "CAST(extract(epoch FROM backend_start) * 1000000 AS bigint)"
#: This connection's backend: its pid and start.
IDENTITY_SQL = f"SELECT pid, {_STARTED} FROM pg_stat_activity WHERE pid = pg_backend_pid()"


@dataclass(frozen=True)
class BackendId:
    """One server backend, by pid and start (microseconds since 1970)."""

    pid: int
    started: int


@dataclass(frozen=True, eq=False)
class SideTarget:
    """How to open a side connection to an engine's server: its driver and that driver's arguments."""

    driver: str
    arguments: dict[str, Any]


def driver_pid(dbapi_connection: Any) -> int | None:
    """The backend pid a DBAPI connection's driver got at connect, or ``None`` if it does not tell."""
    raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)  # SQLAlchemy's async adapters
    for getter in ("get_server_pid", "get_backend_pid"):  # asyncpg, psycopg2
        method = getattr(raw, getter, None)
        if callable(method):
            return int(method())
    info = getattr(raw, "info", None)  # psycopg 3
    pid = getattr(info, "backend_pid", None)
    return pid if isinstance(pid, int) else None


def _in_list(backends: Sequence[BackendId]) -> str:
    rows = ", ".join(f"({int(b.pid)}, {int(b.started)})" for b in backends)
    return f"(pid, {_STARTED}) IN (VALUES {rows})"


def _terminate_sql(backends: Sequence[BackendId]) -> str:
    return f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE {_in_list(backends)}"


def _left_sql(backends: Sequence[BackendId]) -> str:
    return f"SELECT count(*) FROM pg_stat_activity WHERE {_in_list(backends)}"


class _Ending:
    """The backends one call of :func:`end_backends` ends: those it was given, and those taken in since."""

    def __init__(self, backends: Sequence[BackendId], more: More[BackendId]) -> None:
        self.backends = list(backends)
        self._more = more
        #: When to give up waiting: :data:`~boundeddb._dialects.enders.END_WAIT_S` after the last taken in.
        self.deadline = time.monotonic() + END_WAIT_S

    def after(self, left: int) -> list[BackendId] | None:
        """
        What to terminate next, once ``left`` of :attr:`backends` are still on the server: those handed
        in since (now among :attr:`backends` too), ``[]`` to poll again, ``None`` when done or too late.
        """
        new = self._more()
        if new:
            self.backends += new
            self.deadline = time.monotonic() + END_WAIT_S
            return new
        if not left:
            return None
        if time.monotonic() > self.deadline:
            _not_ended(self.backends)
            return None
        return []


def end_backends(target: SideTarget, backends: Sequence[BackendId], more: More[BackendId] = list) -> None:
    """
    Terminate ``backends`` from a side connection to ``target``'s server and wait until they are
    gone, within :data:`~boundeddb._dialects.enders.END_WAIT_S`; meanwhile, terminate those that
    ``more()`` hands in too. A side connection that cannot be opened, fails, or whose query takes
    longer than :data:`_QUERY_S` (a frozen link) is given up and another one opened meanwhile.
    Failures are logged.
    """
    ending = _Ending(backends, more)
    attempt = _attempt_asyncpg if target.driver == "asyncpg" else _attempt_sync
    while True:
        try:
            attempt(target, ending)
            return
        except Exception as error:
            if time.monotonic() + _RETRY_S > ending.deadline:
                pids = ", ".join(str(b.pid) for b in ending.backends)
                logger.warning("PostgreSQL: ending discarded backend(s) %s failed: %s", pids, error)
                return
            logger.debug("PostgreSQL: a side connection failed, opening another: %s", error)
            time.sleep(_RETRY_S)


def _query_s(deadline: float) -> float:
    """How long the side connection's next query may take: :data:`_QUERY_S`, at most until ``deadline``."""
    return max(_RETRY_S, min(_QUERY_S, deadline - time.monotonic()))


def _attempt_sync(target: SideTarget, ending: _Ending) -> None:
    """One side connection on psycopg or psycopg2: terminate, then wait until the backends are gone."""
    if target.driver == "psycopg2":
        import psycopg2  # type: ignore[import-untyped,unused-ignore]

        connection: Any = psycopg2.connect(**target.arguments)
    else:
        import psycopg

        connection = psycopg.connect(**target.arguments)
    try:
        connection.autocommit = True
        cursor = connection.cursor()
        with _Watchdog(connection.fileno()) as watchdog:
            new: list[BackendId] | None = ending.backends
            while new is not None:
                if new:
                    with watchdog.armed(_query_s(ending.deadline)):
                        cursor.execute(_terminate_sql(new))
                with watchdog.armed(_query_s(ending.deadline)):
                    cursor.execute(_left_sql(ending.backends))
                    new = ending.after(cursor.fetchone()[0])
                if new == []:
                    time.sleep(_POLL_S)
    finally:
        connection.close()


class _Watchdog:
    """
    Shuts a blocking connection's socket down when a query outlives its time: the driver then fails it.

    A link frozen half-open never answers; a blocking driver would wait for it until the deadline.
    """

    def __init__(self, fileno: int) -> None:
        self._fileno = fileno
        self._condition = threading.Condition()
        self._until: float | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="boundeddb-end-watchdog", daemon=True)

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._thread.join()

    @contextlib.contextmanager
    def armed(self, seconds: float) -> Iterator[None]:
        """Shut the socket down if the block takes more than ``seconds``."""
        with self._condition:
            self._until = time.monotonic() + seconds
            self._condition.notify()
        try:
            yield
        finally:
            with self._condition:
                self._until = None

    def _watch(self) -> None:
        with self._condition:
            while not self._closed:
                if self._until is None:
                    self._condition.wait()
                elif time.monotonic() < self._until:
                    self._condition.wait(self._until - time.monotonic())
                else:
                    self._until = None
                    with (
                        contextlib.suppress(OSError, ValueError),
                        socket.fromfd(self._fileno, socket.AF_INET, socket.SOCK_STREAM) as side,
                    ):  # a duplicate of the descriptor: shutting it down ends the connection
                        side.shutdown(socket.SHUT_RDWR)


def _attempt_asyncpg(target: SideTarget, ending: _Ending) -> None:
    """One side connection on asyncpg, in an event loop of its own: :func:`_attempt_sync`'s steps."""
    asyncio.run(_end_asyncpg(target.arguments, ending))


async def _end_asyncpg(arguments: dict[str, Any], ending: _Ending) -> None:
    import asyncpg

    # This loop's stray errors (asyncpg's on a connection given up) are the side connection's own.
    asyncio.get_running_loop().set_exception_handler(_side_loop_error)
    connection = await asyncpg.connect(**arguments)
    try:
        new: list[BackendId] | None = ending.backends
        while new is not None:
            if new:
                await asyncio.wait_for(connection.fetchval(_terminate_sql(new)), _query_s(ending.deadline))
            left = await asyncio.wait_for(
                connection.fetchval(_left_sql(ending.backends)), _query_s(ending.deadline)
            )
            new = ending.after(left)
            if new == []:
                await asyncio.sleep(_POLL_S)
    finally:
        connection.terminate()


def _side_loop_error(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    logger.debug("PostgreSQL: side connection: %s", context.get("message"), exc_info=context.get("exception"))


def _not_ended(backends: Sequence[BackendId]) -> None:
    pids = ", ".join(str(b.pid) for b in backends)
    logger.warning("PostgreSQL: backend(s) %s not ended %s s after pg_terminate_backend", pids, END_WAIT_S)


def side_target(dialect: Any, url: Any) -> SideTarget | None:
    """How to open a side connection for an engine of ``dialect`` on ``url``; ``None`` for other drivers."""
    driver = str(dialect.driver)
    _, arguments = dialect.create_connect_args(url)
    arguments = dict(arguments)
    if driver == "asyncpg":
        import asyncpg

        accepted = inspect.signature(asyncpg.connect).parameters
        arguments = {name: value for name, value in arguments.items() if name in accepted}
        settings = dict(arguments.get("server_settings") or {})
        settings["application_name"] = SIDE_APPLICATION
        arguments.update(server_settings=settings, timeout=_CONNECT_S)
        return SideTarget("asyncpg", arguments)
    if driver in ("psycopg", "psycopg_async", "psycopg2"):
        arguments.pop("context", None)  # SQLAlchemy's adapters for its own connections
        arguments.update(application_name=SIDE_APPLICATION, connect_timeout=_CONNECT_S)
        return SideTarget("psycopg2" if driver == "psycopg2" else "psycopg", arguments)
    return None
