"""Fixtures of the ProcessRunner tests (``test_process_runner.py``, ``test_process_batches.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from boundeddb import ProcessRunner
from boundeddb.testing import PostgresServer, driver_url
from tests.support import process_units as units


def connect_args(driver: str, schema: str, app: str) -> dict[str, Any]:
    if driver == "asyncpg":
        return {"server_settings": {"search_path": schema, "application_name": app}}
    return {"options": f"-c search_path={schema}", "application_name": app}


@pytest.fixture
def rows(admin: Engine) -> Iterator[Engine]:
    """The process_rows table, new for the test, in the test run's schema; yields the admin engine."""
    units.Base.metadata.create_all(admin)
    yield admin
    units.Base.metadata.drop_all(admin)


@pytest.fixture
def make_runner(
    pg_server: PostgresServer, pg_schema: str, app_name: str
) -> Iterator[Callable[..., ProcessRunner]]:
    """``make(driver, **options)``: a ProcessRunner on the test schema and application_name; closed after."""
    made: list[ProcessRunner] = []

    def make(driver: str = "asyncpg", **options: Any) -> ProcessRunner:
        url = driver_url(pg_server.url, driver)  # type: ignore[arg-type]
        engine_options = {"connect_args": connect_args(driver, pg_schema, app_name)}
        runner = ProcessRunner(url, engine_options=engine_options, **options)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()
