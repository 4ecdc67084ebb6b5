"""
Helpers for testing code that uses boundeddb against a real PostgreSQL.

:func:`postgres` finds a server the way boundeddb's own tests and benchmarks do:
the URL in an environment variable if it is set, else a local server if one answers,
else an embedded PostgreSQL started from the ``pgserver`` wheel in a temporary directory.
With ``pip install pgserver``, a machine with only Python can run the tests.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from sqlalchemy.engine import URL, make_url

__all__ = ["PostgresServer", "driver_url", "postgres"]

#: The drivers boundeddb knows how to derive URLs for.
Driver = Literal["asyncpg", "psycopg", "psycopg2"]


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    """
    A PostgreSQL server that answered, and where it came from.

    .. versionadded:: 0.1.0
    """

    #: The server's URL without a driver, as in ``postgresql://...``. Add one with :func:`driver_url`.
    url: URL
    #: ``"env"`` for the environment variable, ``"local"`` when the default URL answered,
    #: or ``"embedded"`` for a pgserver started for this process.
    source: Literal["env", "local", "embedded"]

    def describe(self) -> str:
        """A line for logs and reports, with the password hidden."""
        return f"{self.url.render_as_string(hide_password=True)} ({self.source})"


def driver_url(url: URL | str, driver: Driver) -> URL:
    """Return ``url`` with its driver set to ``driver``, as in ``postgresql+asyncpg://...``."""
    return make_url(url).set(drivername=f"postgresql+{driver}")


def _answers(url: URL, timeout: float = 3.0) -> bool:
    """Whether a PostgreSQL server accepts an asyncpg connection at ``url``."""
    import asyncpg

    async def probe() -> None:
        connection = await asyncpg.connect(
            host=url.host or url.query.get("host"),
            port=url.port,
            user=url.username,
            password=url.password,
            database=url.database,
            timeout=timeout,
        )
        await connection.close()

    try:
        asyncio.run(probe())
    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    return True


@contextmanager
def postgres(
    default: str = "postgresql://postgres@127.0.0.1:5432/test",
    *,
    env_var: str = "BOUNDEDDB_TEST_DATABASE_URL",
    embedded: bool = False,
) -> Iterator[PostgresServer]:
    """
    Yield a PostgreSQL server that answers: ``$env_var``, else ``default``, else an embedded one.

    The embedded server, from the ``pgserver`` wheel, lives in a temporary directory and is
    stopped and removed when the context exits. ``embedded=True`` starts one whatever answers.

    Raises:
        RuntimeError: if nothing answers and ``pgserver`` is not installed.

    .. versionadded:: 0.1.0
    """
    configured = os.environ.get(env_var)
    if configured and not embedded:
        url = make_url(configured).set(drivername="postgresql")
        yield PostgresServer(url, "env")
        return
    url = make_url(default)
    if not embedded and _answers(url):
        yield PostgresServer(url, "local")
        return
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset: as root, in CI, in a container.
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as error:
        msg = (
            f"no PostgreSQL answers at {url.render_as_string(hide_password=True)} and pgserver is "
            f"not installed: start a server, set {env_var}, or `pip install pgserver`"
        )
        raise RuntimeError(msg) from error
    with tempfile.TemporaryDirectory(prefix="boundeddb-pg-") as directory:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the same warning, from pgserver's own calls
            server = pgserver.get_server(directory, cleanup_mode="delete")
        try:
            yield PostgresServer(make_url(server.get_uri()), "embedded")
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                server.cleanup()
