"""Engine options for PostgreSQL behind a pooler in transaction mode, such as PgBouncer."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.engine import URL, make_url

__all__ = ["pgbouncer_engine_options"]

#: The PostgreSQL drivers :func:`pgbouncer_engine_options` knows, by SQLAlchemy driver name.
DRIVERS = ("asyncpg", "psycopg", "psycopg_async", "psycopg2")


def _asyncpg_statement_name() -> str:
    """A prepared statement name no other client of the pooler will ever use."""
    return f"__asyncpg_{uuid.uuid4().hex}__"


def pgbouncer_engine_options(url: str | URL) -> dict[str, Any]:
    """
    Return the ``create_engine`` / ``create_async_engine`` keyword arguments that make ``url``'s
    driver safe behind a pooler in transaction mode, PgBouncer's ``pool_mode = transaction``.

    In transaction mode the pooler hands each transaction whichever server connection is free, so
    a prepared statement made on one server connection is not there on the next, or a name used
    by one client is already taken by another: ``prepared statement "__asyncpg_stmt_1__" does not
    exist`` / ``already exists``.  PgBouncer 1.21 and later can track prepared statements with
    ``max_prepared_statements``. Older ones, such as Debian 12's 1.18, cannot.  The options
    returned here work with both:

    - ``postgresql+asyncpg``: ``connect_args`` with ``statement_cache_size=0``, so that asyncpg
      keeps no prepared statements between calls and re-prepares a statement within its own
      message sequence. ``prepared_statement_cache_size=0`` turns off SQLAlchemy's own cache of
      asyncpg statements for the same reason. ``prepared_statement_name_func`` gives each
      statement a unique name, so that two clients that share a server connection never collide.
      Cost: the server parses every statement each time, an extra ``Parse`` message but no extra
      round trip. The bench's ``fleet`` scenario measures it.
    - ``postgresql+psycopg`` and ``postgresql+psycopg_async``, psycopg 3: ``connect_args`` with
      ``prepare_threshold=None``, which turns off psycopg's automatic server-side preparation of a
      query that ran 5 times.  Cost: the same re-parse, only for queries run often.
    - ``postgresql+psycopg2``: nothing. psycopg2 never prepares statements on the server.

    The result is a new dict every call: merge your own options into it, ``connect_args``
    included.  SQLAlchemy's pool may stay as it is: its connections are client connections to
    the pooler, and a server connection is held only for the length of a transaction, which the
    runner ends for every unit.  Set ``pool_size`` and a runner's ``limit`` per process so
    that the sum over the processes stays within the pooler's ``max_client_conn``. The server
    sees at most its ``default_pool_size`` connections however many clients wait.  A
    ``poolclass=NullPool`` also works and opens a client connection per unit. The runners then
    need an explicit ``limit``, as for any pool without a fixed capacity.  Session state does not
    survive a transaction behind such a pooler: set ``search_path`` and other settings with
    ``SET LOCAL`` inside the unit, or qualify names, not through startup options.

    Args:
        url: The database URL, a string or a :class:`sqlalchemy.engine.URL`, with its driver.

    Returns:
        The keyword arguments, e.g. ``{"connect_args": {"prepare_threshold": None}}``.

    Raises:
        ValueError: if the URL is not PostgreSQL or its driver is not one of asyncpg, psycopg,
            sync or async, or psycopg2. The message names the driver.

    Example::

        url = "postgresql+asyncpg://app@pgbouncer:6432/app"
        engine = create_async_engine(url, pool_size=5, max_overflow=0, **pgbouncer_engine_options(url))

    .. versionadded:: 0.2.0
    """
    parsed = make_url(url)
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if backend != "postgresql" or driver not in DRIVERS:
        msg = (
            f"pgbouncer_engine_options(url): {parsed.drivername!r} is not a PostgreSQL driver it knows; "
            f"use postgresql+asyncpg, postgresql+psycopg (sync or async) or postgresql+psycopg2"
        )
        raise ValueError(msg)
    if driver == "asyncpg":
        return {
            "connect_args": {
                "statement_cache_size": 0,
                "prepared_statement_cache_size": 0,
                "prepared_statement_name_func": _asyncpg_statement_name,
            }
        }
    if driver in ("psycopg", "psycopg_async"):
        return {"connect_args": {"prepare_threshold": None}}
    return {}
