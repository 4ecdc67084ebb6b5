"""
The test's side of a kill test: the killed job's database for each server, and one killed run.

tests/faults/test_journal_kill.py and tests/faults/test_load_kill.py share them; their ``Target``
classes (a :class:`~tests.support.journal_kill.Ledger` each) say what the job writes and how to check it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from boundeddb.testing import PostgresServer, driver_url
from tests.support.batches import SqliteFile
from tests.support.journal_kill import Child, Kill, backends_in_transaction
from tests.support.servers import MariaDB, PostgreSQL

__all__ = ["job_target", "kill_run", "let_go"]


class KilledJobTarget(Protocol):
    """What :func:`kill_run` needs of a test's ``Target``."""

    transaction_survives_kill: bool

    def arguments(self) -> list[str]: ...

    def in_transaction(self) -> int: ...

    def wait_gone(self, where: str) -> None: ...

    def check_exactly_once(self, where: str) -> Any: ...


TargetT = TypeVar("TargetT")


def job_target(
    make: type[TargetT], case: Any, request: pytest.FixtureRequest, tmp_path: Path, sqlite_name: str
) -> TargetT:
    """``make(case, url, admin, db, ...)`` on ``case.server``: a PostgreSQL schema, MariaDB database, file."""
    if case.server == "postgresql":
        server: PostgresServer = request.getfixturevalue("pg_server")
        pg: PostgreSQL = request.getfixturevalue("pg_db")
        schema: str = request.getfixturevalue("pg_schema")
        url = driver_url(server.url, case.driver).render_as_string(hide_password=False)  # type: ignore[arg-type]
        return make(
            case,  # type: ignore[call-arg]
            url,
            pg.admin,
            pg,
            schema=schema,
            args=[f"--schema={schema}", f"--app={pg.app}"],
            in_transaction=lambda: backends_in_transaction(pg.admin, pg.app),
        )
    if case.server == "mariadb":
        mysql: MariaDB = request.getfixturevalue("mysql_db")
        return make(
            case,  # type: ignore[call-arg]
            mysql.url(case.driver).render_as_string(hide_password=False),
            mysql.admin.execution_options(schema_translate_map={None: mysql.database}),
            mysql,
            schema=mysql.database,
            args=[],
            in_transaction=lambda: len(mysql.threads_in_transaction() & mysql.connection_ids()),
        )
    path = tmp_path / sqlite_name
    drivername = "sqlite+aiosqlite" if case.driver == "aiosqlite" else "sqlite"
    return make(
        case,  # type: ignore[call-arg]
        f"{drivername}:///{path}",
        create_engine(f"sqlite:///{path}", poolclass=NullPool),
        SqliteFile(path),
        schema=None,
        args=[],
        in_transaction=lambda: int(path.with_name(path.name + "-journal").exists()),
        transaction_survives_kill=True,
    )


def let_go(target: Any, case: Any, request: pytest.FixtureRequest) -> None:
    """Drop the job's tables once the test is done with them."""
    if case.server == "postgresql":  # a child's backend left in a transaction would block DROP TABLE
        request.getfixturevalue("pg_db").terminate()
    target.drop()
    if case.server == "sqlite":
        target.admin.dispose()


def kill_run(job: str, target: KilledJobTarget, tmp_path: Path, run: int, how: str, before: int) -> Kill:
    """
    Start ``job`` and SIGKILL it once ``how`` says: ``rows>=N``, once the target counts N rows done,
    or ``after=S``, S seconds after it printed ``started``. Then wait for its connections to end and
    check what it did (``target.check_exactly_once``).
    """
    kill = Kill(how=how, before=before, in_transaction=0)
    child = Child(job, target, target.arguments(), tmp_path, run)  # type: ignore[arg-type]
    try:
        if how.startswith("rows>="):
            child.freeze_at(how)
        else:
            child.wait_for(child.started, "started")
            # The fault's timing, not a sync point: nothing waits for what the job did meanwhile.
            time.sleep(float(how.removeprefix("after=")))
        if not target.transaction_survives_kill:
            kill.in_transaction = target.in_transaction()
        child.alive_or_fail(f"before the kill ({how})")
    finally:
        child.kill()
    if target.transaction_survives_kill:
        kill.in_transaction = target.in_transaction()
    assert child.process.returncode == -signal.SIGKILL, (child.process.returncode, child.outputs())
    target.wait_gone(f"after kill {run} ({how})")
    kill.after = len(target.check_exactly_once(f"after kill {run} ({how})"))
    return kill
