"""
``?autocommit=...`` in a MySQL engine's URL is refused when a runner is made.

SQLAlchemy passes the URL's text to the driver, and every MySQL driver takes any non-empty string as
true: ``?autocommit=false`` (or ``=0``) switches autocommit *on*, each statement commits by itself, and
a failed unit's earlier statements stay committed.  The refusal needs no server; the driver's
behaviour itself is checked against the local MariaDB where one answers (as ``tests/test_mysql.py``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from boundeddb import ChunkedRunner, SemaphoreRunner, ThreadOffloadRunner

pymysql = pytest.importorskip("pymysql", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")
pytest.importorskip("aiomysql", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")
pytest.importorskip("asyncmy", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")

SERVER = make_url(os.environ.get("BOUNDEDDB_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"))
REFUSED = (
    r"^the engine's URL sets autocommit=(false|0|true): SQLAlchemy passes that text to the MySQL driver, "
    r"which takes any non-empty string as true, .* isolation_level='AUTOCOMMIT'\)$"
)


def _runner(kind: str, url: str) -> Any:
    if kind == "threads":
        return ThreadOffloadRunner(sessionmaker(create_engine(url)), limit=2)
    sessions = async_sessionmaker(create_async_engine(url))
    return (
        SemaphoreRunner(sessions, limit=2) if kind == "semaphore" else ChunkedRunner(sessions, chunk_size=2)
    )


@pytest.mark.parametrize("value", ["false", "0", "true"])
@pytest.mark.parametrize(
    ("kind", "driver"),
    [("threads", "pymysql"), ("semaphore", "aiomysql"), ("semaphore", "asyncmy"), ("chunked", "aiomysql")],
)
def test_an_autocommit_in_the_url_is_refused(kind: str, driver: str, value: str) -> None:
    """Every runner on every MySQL driver refuses ?autocommit=..., whatever its value, and says why."""
    with pytest.raises(ValueError, match=REFUSED):
        _runner(kind, f"mysql+{driver}://root@127.0.0.1:3306/test?autocommit={value}")


def test_isolation_level_autocommit_is_left_to_the_user() -> None:
    """create_engine(isolation_level='AUTOCOMMIT'), which SQLAlchemy knows about, is not refused."""
    engine = create_engine("mysql+pymysql://root@127.0.0.1:3306/test", isolation_level="AUTOCOMMIT")
    ThreadOffloadRunner(sessionmaker(engine), limit=2)


def _answers() -> bool:
    try:
        pymysql.connect(
            host=SERVER.host, port=SERVER.port or 3306, user=SERVER.username, connect_timeout=3
        ).close()
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _answers(), reason="no MySQL/MariaDB server answers (set BOUNDEDDB_TEST_MYSQL_URL)")
@pytest.mark.parametrize("value", ["false", "0"])
def test_the_driver_takes_autocommit_false_for_true(value: str) -> None:
    """Why the refusal: with ?autocommit=false in the URL, pymysql's session runs with @@autocommit = 1."""
    engine = create_engine(SERVER.set(drivername="mysql+pymysql").update_query_dict({"autocommit": value}))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT @@autocommit")).scalar_one() == 1
    finally:
        engine.dispose()
