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
import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .enders import END_WAIT_S

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


def end_backends(target: SideTarget, backends: Sequence[BackendId]) -> None:
    """
    Terminate ``backends`` from a side connection to ``target``'s server and wait until they are
    gone, all within :data:`~boundeddb._dialects.enders.END_WAIT_S`. A connection refused (the
    network or the server down for a moment) is tried again meanwhile. Failures are logged.
    """
    deadline = time.monotonic() + END_WAIT_S
    try:
        if target.driver == "asyncpg":
            asyncio.run(_end_asyncpg(target.arguments, backends, deadline))
        else:
            _end_sync(target, backends, deadline)
    except Exception as error:
        pids = ", ".join(str(b.pid) for b in backends)
        logger.warning("PostgreSQL: ending discarded connections' backend(s) %s failed: %s", pids, error)


def _connect_sync(target: SideTarget, deadline: float) -> Any:
    if target.driver == "psycopg2":
        import psycopg2  # type: ignore[import-untyped,unused-ignore]

        connect: Any = psycopg2.connect
    else:
        import psycopg

        connect = psycopg.connect
    while True:
        try:
            connection = connect(**target.arguments)
        except Exception:
            if time.monotonic() + _RETRY_S > deadline:
                raise
            time.sleep(_RETRY_S)
        else:
            connection.autocommit = True
            return connection


def _end_sync(target: SideTarget, backends: Sequence[BackendId], deadline: float) -> None:
    connection = _connect_sync(target, deadline)
    try:
        cursor = connection.cursor()
        cursor.execute(_terminate_sql(backends))
        while True:
            cursor.execute(_left_sql(backends))
            if not cursor.fetchone()[0]:
                return
            if time.monotonic() > deadline:
                _not_ended(backends)
                return
            time.sleep(_POLL_S)
    finally:
        connection.close()


async def _end_asyncpg(arguments: dict[str, Any], backends: Sequence[BackendId], deadline: float) -> None:
    import asyncpg

    while True:
        try:
            connection = await asyncpg.connect(**arguments)
        except Exception:
            if time.monotonic() + _RETRY_S > deadline:
                raise
            await asyncio.sleep(_RETRY_S)
        else:
            break
    try:
        await connection.fetchval(_terminate_sql(backends))
        while await connection.fetchval(_left_sql(backends)):
            if time.monotonic() > deadline:
                _not_ended(backends)
                return
            await asyncio.sleep(_POLL_S)
    finally:
        await connection.close()


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
