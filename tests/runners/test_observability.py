"""Observability: OpenTelemetry metrics and spans, the runner-wide hook, cumulative statistics, logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.trace import StatusCode
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

import boundeddb
from boundeddb import Outcome, ProcessRunner, RetryPolicy, SemaphoreRunner, ThreadOffloadRunner, UnitTimeout
from boundeddb.testing import PostgresServer, driver_url
from tests.support import process_units
from tests.support.models import Item
from tests.support.telemetry import Telemetry, telemetry_fixture  # noqa: F401 -- a fixture pytest finds here

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def slow_commit(admin: Engine, items_table: None) -> Iterator[None]:
    """A deferred constraint trigger: the COMMIT of a transaction that inserted an item sleeps 2 s."""
    with admin.connect() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION obs_slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE CONSTRAINT TRIGGER obs_slow_commit AFTER INSERT ON items "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION obs_slow_commit()"
            )
        )
    yield
    with admin.connect() as connection:
        connection.execute(text("DROP TRIGGER IF EXISTS obs_slow_commit ON items"))
        connection.execute(text("DROP FUNCTION IF EXISTS obs_slow_commit()"))


async def select_one(session: AsyncSession) -> int:
    return int((await session.execute(text("SELECT 1"))).scalar_one())


def select_one_sync(session: Session) -> int:
    return int(session.execute(text("SELECT 1")).scalar_one())


async def fail(session: AsyncSession) -> None:
    await session.execute(text("SELECT 1"))
    raise ValueError("a failing unit")


async def insert_slowly(session: AsyncSession) -> int:
    session.add(Item(key="slow", unit=0))
    await session.flush()  # the trigger runs at COMMIT, past the unit's timeout
    return 0


def is_value_error(error: Exception) -> bool:
    return isinstance(error, ValueError)


# -- metrics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.usefixtures("slow_commit")
async def test_each_outcome_is_counted_with_its_attributes(
    telemetry: Telemetry, make_async_engine: Any
) -> None:
    """ok, error and commit_unknown units in unit.duration; every unit in unit.wait; the gauges' runner."""
    runner = SemaphoreRunner(
        async_sessionmaker(make_async_engine(pool_size=4)), limit=4, errors="collect", timeout=1.0
    )
    report = await runner.run([select_one, select_one, select_one, fail, fail, insert_slowly])
    assert [o.commit_unknown for o in report.outcomes] == [False] * 5 + [True]
    assert isinstance(report.outcomes[5].error, UnitTimeout)
    assert telemetry.counts("boundeddb.unit.duration", "boundeddb.outcome") == {
        "ok": 3,
        "error": 2,
        "commit_unknown": 1,
    }
    for point in telemetry.points("boundeddb.unit.duration"):
        assert point.attributes["boundeddb.runner"] == "SemaphoreRunner"
        assert point.attributes["db.system"] == "postgresql"
    assert telemetry.counts("boundeddb.unit.wait", "boundeddb.priority") == {0: 6}
    # One point per runner class and database: other tests' runners not yet collected (SQLite, MySQL)
    # have points of their own beside this one's.
    limits = {
        (p.attributes["boundeddb.runner"], p.attributes["db.system"]): p.value
        for p in telemetry.points("boundeddb.limit")
    }
    assert limits[("SemaphoreRunner", "postgresql")] >= 4  # this runner's, summed with other live ones
    assert all(p.value >= 0 for p in telemetry.points("boundeddb.units.in_flight"))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_retries_are_counted_and_handed_to_the_policys_hook(
    telemetry: Telemetry, make_async_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A unit that fails twice, then commits: 2 retries counted, on_retry told each, DEBUG logs only."""
    calls: list[tuple[str, int, float]] = []
    attempts = 0

    async def flaky(session: AsyncSession) -> int:
        nonlocal attempts
        attempts += 1
        await session.execute(text("SELECT 1"))
        if attempts < 3:
            raise ValueError(f"attempt {attempts}")
        return attempts

    policy = RetryPolicy(
        attempts=3,
        initial_delay=0.001,
        retry_on=is_value_error,
        on_retry=lambda error, attempt, delay: calls.append((str(error), attempt, delay)),
    )
    runner = SemaphoreRunner(async_sessionmaker(make_async_engine(pool_size=2)), limit=2, retry=policy)
    caplog.set_level(logging.DEBUG, logger="boundeddb")
    assert (await runner.run([flaky])).values() == [3]
    assert [(message, attempt) for message, attempt, _ in calls] == [("attempt 1", 1), ("attempt 2", 2)]
    assert sum(point.value for point in telemetry.points("boundeddb.unit.retries")) == 2
    [span] = telemetry.unit_spans()
    assert span.attributes is not None
    assert span.attributes["boundeddb.unit.attempts"] == 3
    retries = [record for record in caplog.records if record.name == "boundeddb.retry"]
    assert [record.levelno for record in retries] == [logging.DEBUG, logging.DEBUG]
    assert [(record.unit, record.attempt, record.error) for record in retries] == [  # type: ignore[attr-defined]
        (0, 1, "ValueError"),
        (0, 2, "ValueError"),
    ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_unit_whose_retries_ran_out_is_one_warning(
    make_async_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Three attempts that fail: two DEBUG lines for the retries, one WARNING when they run out."""
    policy = RetryPolicy(attempts=3, initial_delay=0.001, retry_on=is_value_error)
    runner = SemaphoreRunner(
        async_sessionmaker(make_async_engine(pool_size=2)), limit=2, retry=policy, errors="collect"
    )
    caplog.set_level(logging.DEBUG, logger="boundeddb")
    report = await runner.run([fail])
    assert report.outcomes[0].attempts == 3
    levels = [record.levelno for record in caplog.records if record.name == "boundeddb.retry"]
    assert levels == [logging.DEBUG, logging.DEBUG, logging.WARNING]


# -- spans ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "anyio_backend"),
    [("semaphore", "asyncio"), ("threads", "asyncio"), ("threads", "trio")],
)
async def test_unit_spans_are_children_of_the_callers_span(
    telemetry: Telemetry, make_async_engine: Any, make_sync_engine: Any, kind: str, anyio_backend: str
) -> None:
    """A run and a submit under a request's span: every unit's span is its child, errors marked."""
    runner: Any
    if kind == "semaphore":
        runner = SemaphoreRunner(
            async_sessionmaker(make_async_engine(pool_size=2)), limit=2, errors="collect"
        )
        units: list[Any] = [select_one, select_one, fail]
        one: Any = select_one
    else:

        def fail_sync(session: Session) -> None:
            raise ValueError("a failing unit")

        runner = ThreadOffloadRunner(sessionmaker(make_sync_engine(pool_size=2)), limit=2, errors="collect")
        units, one = [select_one_sync, select_one_sync, fail_sync], select_one_sync
    tracer = telemetry.tracers.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        await runner.run(units)
        await runner.submit(one)
    spans = telemetry.unit_spans()
    assert len(spans) == 4
    context = request.get_span_context()
    for span in spans:
        assert span.parent is not None
        assert (span.parent.trace_id, span.parent.span_id) == (context.trace_id, context.span_id)
    failed = [span for span in spans if span.status.status_code is StatusCode.ERROR]
    assert len(failed) == 1
    assert failed[0].attributes is not None
    assert failed[0].attributes["boundeddb.outcome"] == "error"
    assert [event.name for event in failed[0].events] == ["exception"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_statement_spans_are_children_of_their_units_span(
    telemetry: Telemetry, make_async_engine: Any
) -> None:
    """opentelemetry-instrumentation-sqlalchemy's spans nest under the unit that ran the statement."""
    engine = make_async_engine(pool_size=2)
    instrumentor = SQLAlchemyInstrumentor()
    instrumentor.instrument(engine=engine.sync_engine, tracer_provider=telemetry.tracers, skip_dep_check=True)
    try:
        runner = SemaphoreRunner(async_sessionmaker(engine), limit=2)
        await runner.run([select_one, select_one, select_one])
    finally:
        instrumentor.uninstrument()
    units = {span.context.span_id for span in telemetry.unit_spans()}
    statements = [s for s in telemetry.exporter.get_finished_spans() if s.name != "boundeddb.unit"]
    assert len(units) == 3
    assert len(statements) >= 3
    selects = [s for s in statements if "SELECT" in s.name]
    assert len(selects) == 3
    assert {s.parent.span_id for s in selects if s.parent is not None} == units


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_nothing_is_recorded_after_uninstrument(telemetry: Telemetry, make_async_engine: Any) -> None:
    """After uninstrument(): no span, no data point more (the units run as before)."""
    runner = SemaphoreRunner(async_sessionmaker(make_async_engine(pool_size=2)), limit=2)
    await runner.run([select_one])
    before = telemetry.counts("boundeddb.unit.duration", "boundeddb.outcome")
    boundeddb.uninstrument()
    assert (await runner.run([select_one, select_one])).values() == [1, 1]
    await runner.submit(select_one)
    assert telemetry.counts("boundeddb.unit.duration", "boundeddb.outcome") == before == {"ok": 1}
    assert len(telemetry.unit_spans()) == 1
    assert telemetry.points("boundeddb.limit") == []  # the gauges observe nothing either


# -- the runner's hook and its statistics ------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_runners_hook_sees_every_unit_submit_included(
    make_async_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """on_outcome on the runner: every unit of run() and submit(); its errors are logged, not raised."""
    seen: list[Outcome[Any]] = []

    def hook(outcome: Outcome[Any]) -> None:
        seen.append(outcome)
        if len(seen) == 2:
            raise RuntimeError("a broken metrics hook")

    called: list[int] = []
    runner = SemaphoreRunner(async_sessionmaker(make_async_engine(pool_size=2)), limit=2, on_outcome=hook)
    assert await runner.submit(select_one, on_outcome=lambda outcome: called.append(outcome.index)) == 1
    assert await runner.submit(select_one) == 1  # the runner's hook raised here: logged only
    assert (await runner.run([select_one, select_one])).values() == [1, 1]
    assert len(seen) == 4
    assert called == [0]
    assert any("the runner's on_outcome raised" in r.getMessage() for r in caplog.records)

    def broken(outcome: Outcome[Any]) -> None:
        raise KeyError("the call's own hook")

    with pytest.raises(KeyError, match="the call's own hook"):
        await runner.submit(select_one, on_outcome=broken)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_threads_hook_is_served_on_the_loop(make_sync_engine: Any) -> None:
    """ThreadOffloadRunner: the runner's hook runs on the event loop's thread, for run() and submit()."""
    import threading

    threads: set[int] = set()
    runner = ThreadOffloadRunner(
        sessionmaker(make_sync_engine(pool_size=2)),
        limit=2,
        on_outcome=lambda outcome: threads.add(threading.get_ident()),
    )
    await runner.run([select_one_sync] * 5)
    await runner.submit(select_one_sync)
    assert threads == {threading.get_ident()}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.usefixtures("slow_commit")
async def test_cumulative_statistics_add_up_after_a_mixed_run(make_async_engine: Any) -> None:
    """statistics(): succeeded, failed, commit_unknown, retried and the slot wait, over every call."""
    attempts = 0

    async def flaky(session: AsyncSession) -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ValueError("the first attempt")
        return await select_one(session)

    policy = RetryPolicy(attempts=2, initial_delay=0.001, retry_on=is_value_error)
    runner = SemaphoreRunner(
        async_sessionmaker(make_async_engine(pool_size=1)),
        limit=1,
        errors="collect",
        retry=policy,
        timeout=1.0,
    )
    before = runner.statistics()
    assert (before.succeeded, before.failed, before.retried, before.slot_wait_s) == (0, 0, 0, 0.0)
    await runner.run([select_one, flaky, insert_slowly])
    async with anyio.create_task_group() as tasks:
        for _ in range(3):
            tasks.start_soon(runner.submit, select_one)  # one slot: two of them wait
    with pytest.raises(ValueError, match="a failing unit"):
        await runner.submit(fail)  # both attempts fail
    stats = runner.statistics()
    assert stats.succeeded == 1 + 1 + 3  # select_one, flaky on its second attempt, the submits
    assert (stats.failed, stats.commit_unknown) == (2, 1)  # insert_slowly (timed out in COMMIT), fail
    assert stats.retried == 2  # flaky's first attempt, fail's first
    assert stats.slot_wait_s > 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_process_runners_units_are_counted_in_the_caller(
    telemetry: Telemetry, rows_in_processes: Any, pg_server: PostgresServer, pg_schema: str, app_name: str
) -> None:
    """ProcessRunner: unit.duration from the caller's side (the workers make the spans), and statistics."""
    options = {"connect_args": {"server_settings": {"search_path": pg_schema, "application_name": app_name}}}
    async with ProcessRunner(
        driver_url(pg_server.url, "asyncpg"), limit=2, processes=2, errors="collect", engine_options=options
    ) as runner:
        report = await runner.map(process_units.fail_some, range(14))
        stats = runner.statistics()
    assert len(report.failures) == 2
    assert telemetry.counts("boundeddb.unit.duration", "boundeddb.outcome") == {"ok": 12, "error": 2}
    assert {p.attributes["boundeddb.runner"] for p in telemetry.points("boundeddb.unit.duration")} == {
        "ProcessRunner"
    }
    assert (stats.succeeded, stats.failed, stats.in_flight, stats.limit) == (12, 2, 0, 2)


@pytest.fixture
def rows_in_processes(admin: Engine) -> Iterator[None]:
    process_units.Base.metadata.create_all(admin)
    yield
    process_units.Base.metadata.drop_all(admin)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_process_runners_unit_spans_are_children_of_the_callers_span_across_processes(
    telemetry: Telemetry,
    rows_in_processes: Any,
    pg_server: PostgresServer,
    pg_schema: str,
    app_name: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's trace context travels with the call: the workers' unit spans are its children."""
    import json

    spans_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv("BOUNDEDDB_TEST_SPANS", str(spans_file))  # the workers' tracer provider writes here
    options = {"connect_args": {"server_settings": {"search_path": pg_schema, "application_name": app_name}}}
    tracer = telemetry.tracers.get_tracer("test")
    async with ProcessRunner(
        driver_url(pg_server.url, "asyncpg"), limit=2, processes=2, engine_options=options
    ) as runner:
        with tracer.start_as_current_span("backfill") as backfill:
            report = await runner.map(process_units.insert, range(20))
    context = backfill.get_span_context()
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    units = [span for span in spans if span["name"] == "boundeddb.unit"]
    assert len(units) == 20
    assert {(span["trace"], span["parent"]) for span in units} == {(context.trace_id, context.span_id)}
    assert {span["pid"] for span in units} == {pid for _, pid in report.values()}
    assert telemetry.unit_spans() == []  # the caller makes none of its own: no unit ran here
