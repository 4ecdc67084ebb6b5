"""Watching a run: the progress bar (rich) and the per-outcome hook, on the real PostgreSQL."""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from sqlalchemy import text
from sqlalchemy.engine import Engine

import boundeddb
from boundeddb import Outcome, RetryPolicy, ThreadOffloadRunner
from tests.support.kits import CASE_IDS, CASES, Boom, Kit, eventually
from tests.support.probes import idle_in_transaction

pytestmark = [pytest.mark.postgres, pytest.mark.anyio, pytest.mark.usefixtures("items_table")]
every_kind = pytest.mark.parametrize(("kind", "anyio_backend"), CASES, ids=CASE_IDS)

#: A unit's server work, long enough that a run of a few hundred lasts a few display updates.
SLOW_SELECT = text("SELECT CAST(:i AS integer) FROM pg_sleep(0.005)")


class RecordingProgress(Progress):
    """A rich Progress on a recording console that notes each refresh: when, from which thread, what."""

    def __init__(self) -> None:
        console = Console(record=True, force_terminal=True, width=160, file=io.StringIO())
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed, {task.fields[retried]} retried"),
            TextColumn("{task.fields[in_flight]}/{task.fields[limit]} in flight"),
        )
        super().__init__(*columns, console=console, auto_refresh=False)
        self.refreshes: list[tuple[float, int, list[tuple[float, float | None]]]] = []

    def refresh(self) -> None:
        seen = [(task.completed, task.total) for task in self.tasks]
        self.refreshes.append((time.perf_counter(), threading.get_ident(), seen))
        super().refresh()

    def text(self) -> str:
        return self.console.export_text()


def slow_unit(kit: Kit, i: int) -> Callable[[Any], Any]:
    """A unit that asks the server for ``i`` after 5 ms."""
    if kit.is_async:

        async def unit(session: Any) -> int:
            return int((await session.execute(SLOW_SELECT, {"i": i})).scalar_one())

        return unit

    def sync_unit(session: Any) -> int:
        return int(session.execute(SLOW_SELECT, {"i": i}).scalar_one())

    return sync_unit


@every_kind
async def test_the_bar_counts_every_unit_against_the_total(kit: Kit) -> None:
    """A rich Progress of the caller's gets a task: done of the total, failures, in flight; all at the end."""
    runner = kit.runner(limit=4, errors="collect")
    bar = RecordingProgress()
    units = [kit.insert(i, fail=i % 50 == 7) for i in range(200)]
    report = await runner.run(units, progress=bar)
    assert report.stats.failed == 4
    final = bar.text().splitlines()[-1]
    assert f"{type(runner).__name__}.run" in final
    assert "200/200" in final
    assert "4 failed, 0 retried" in final
    assert "0/4 in flight" in final
    assert not bar.live.is_started  # started for the run, stopped after it
    assert [task.total for task in bar.tasks] == [200]


@every_kind
async def test_the_bar_refreshes_from_the_loop_at_most_ten_times_a_second(kit: Kit) -> None:
    """Refreshes come from the event loop's thread, never a worker thread, about every 100 ms."""
    runner = kit.runner(limit=4)
    bar = RecordingProgress()
    loop_thread = threading.get_ident()
    started = time.perf_counter()
    await runner.run([slow_unit(kit, i) for i in range(300)], progress=bar)
    elapsed = time.perf_counter() - started
    assert {thread for _, thread, _ in bar.refreshes} == {loop_thread}
    assert len(bar.refreshes) <= elapsed / 0.1 + 3  # ~10 a second, and the final state
    progress = [seen[0][0] for _, _, seen in bar.refreshes]
    assert progress == sorted(progress)
    assert progress[-1] == 300


@every_kind
async def test_an_input_without_a_length_shows_no_total_until_the_end(kit: Kit) -> None:
    """A generator has no length: the bar counts with no total, then shows every unit as the total."""
    runner = kit.runner(limit=4)
    bar = RecordingProgress()
    await runner.run((slow_unit(kit, i) for i in range(150)), progress=bar)
    totals = [seen[0][1] for _, _, seen in bar.refreshes]
    assert totals[-1] == 150
    assert set(totals[:-1]) <= {None}
    assert "150/150" in bar.text().splitlines()[-1]


@every_kind
async def test_map_takes_the_total_from_its_items(kit: Kit) -> None:
    """map(fn, items) counts against len(items)."""
    runner = kit.runner(limit=3)
    bar = RecordingProgress()
    report = await runner.map(kit.map_fn(), range(60), progress=bar)
    assert report.values() == [2 * i for i in range(60)]
    assert {seen[0][1] for _, _, seen in bar.refreshes} == {60}
    assert f"{type(runner).__name__}.map" in bar.text()


@every_kind
async def test_a_started_progress_stays_the_callers(kit: Kit) -> None:
    """A Progress the caller already started is left running, with one task per call."""
    runner = kit.runner(limit=3)
    bar = RecordingProgress()
    with bar:
        await runner.run([kit.select(i) for i in range(20)], progress=bar)
        await runner.run([kit.select(i) for i in range(30)], progress="second")
        assert bar.live.is_started
    assert [(task.completed, task.total) for task in bar.tasks] == [(20, 20)]


@every_kind
async def test_the_hook_sees_every_outcome_once_on_the_loop_thread(kit: Kit) -> None:
    """on_outcome gets each unit's final outcome exactly once (retried ones too), on the loop's thread."""
    attempts: dict[int, int] = {}

    def flaky(i: int) -> Callable[[Any], Any]:
        inner = kit.select(i)
        if kit.is_async:

            async def unit(session: Any) -> int:
                attempts[i] = attempts.get(i, 0) + 1
                if i % 10 == 3 and attempts[i] == 1:
                    raise Boom(i)
                return int(await inner(session))

            return unit

        def sync_unit(session: Any) -> int:
            attempts[i] = attempts.get(i, 0) + 1
            if i % 10 == 3 and attempts[i] == 1:
                raise Boom(i)
            return int(inner(session))

        return sync_unit

    retry = RetryPolicy(attempts=2, initial_delay=0.001, retry_on=lambda error: isinstance(error, Boom))
    runner = kit.runner(limit=5, retry=retry)
    seen: list[tuple[Outcome[int], int]] = []
    report = await runner.run(
        [flaky(i) for i in range(100)], on_outcome=lambda o: seen.append((o, threading.get_ident()))
    )
    assert sorted(o.index for o, _ in seen) == list(range(100))
    assert {thread for _, thread in seen} == {threading.get_ident()}
    assert sorted((o.index, o.value, o.attempts) for o, _ in seen) == [
        (i, i, 2 if i % 10 == 3 else 1) for i in range(100)
    ]
    assert report.stats.retried == 10


@every_kind
async def test_the_hook_is_called_as_units_settle_in_completion_order(kit: Kit) -> None:
    """Unit i finishes only once the hook has seen unit i+1: the hook runs during the run, in that order."""
    n = 5
    loop_events = [anyio.Event() for _ in range(n)]
    thread_events = [threading.Event() for _ in range(n)]

    def waiting(i: int) -> Callable[[Any], Any]:
        inner = kit.select(i)
        if kit.is_async:

            async def unit(session: Any) -> int:
                value = int(await inner(session))
                if i < n - 1:
                    await loop_events[i].wait()
                return value

            return unit

        def sync_unit(session: Any) -> int:
            value = int(inner(session))
            if i < n - 1:
                assert thread_events[i].wait(30), "the hook never saw the unit after this one"
            return value

        return sync_unit

    order: list[int] = []

    def hook(outcome: Outcome[int]) -> None:
        order.append(outcome.index)
        if outcome.index > 0:
            loop_events[outcome.index - 1].set()
            thread_events[outcome.index - 1].set()

    runner = kit.runner(limit=n)
    with anyio.fail_after(60):
        report = await runner.run([waiting(i) for i in range(n)], on_outcome=hook)
    assert order == list(reversed(range(n)))
    assert report.values() == list(range(n))


@every_kind
async def test_a_failing_hook_stops_the_run_and_is_raised(kit: Kit, admin: Engine, app_name: str) -> None:
    """The hook's own exception stops the run (nothing new starts), is raised as it is, and leaks nothing."""
    pulled = 0

    def units() -> Iterator[Callable[[Any], Any]]:
        nonlocal pulled
        for i in range(10_000):
            pulled += 1
            yield kit.insert(i)

    class HookFailed(Exception):
        pass

    calls = 0

    def hook(outcome: Outcome[int]) -> None:
        nonlocal calls
        calls += 1
        if calls == 20:
            raise HookFailed(outcome.index)

    runner = kit.runner(limit=4, errors="collect")
    with pytest.raises(HookFailed):
        await runner.run(units(), on_outcome=hook)
    assert calls == 20  # never called again after it raised
    assert pulled < 1_000
    assert kit.pool.checkedout() == 0
    assert eventually(lambda: idle_in_transaction(admin, app_name) == 0, 2)
    # The runner is fine afterwards.
    assert (await runner.run([kit.select(i) for i in range(5)])).values() == list(range(5))


@every_kind
async def test_a_stream_tells_the_hook_before_it_yields(kit: Kit) -> None:
    """stream(on_outcome=...) calls the hook for each outcome, no later than the stream yields it."""
    runner = kit.runner(limit=4)
    told: list[int] = []
    yielded: list[int] = []
    bar = RecordingProgress()
    async for outcome in runner.stream(
        [kit.select(i) for i in range(80)], on_outcome=lambda o: told.append(o.index), progress=bar
    ):
        await anyio.lowlevel.checkpoint()
        yielded.append(outcome.index)
        assert set(yielded) <= set(told) | {outcome.index}
    assert sorted(told) == sorted(yielded) == list(range(80))
    assert "80/80" in bar.text().splitlines()[-1]


@pytest.mark.parametrize("kind", ["threads-psycopg"])
def test_run_sync_serves_the_hook_and_the_bar_in_the_calling_thread(kit: Kit) -> None:
    """run_sync(progress=..., on_outcome=...) serves both in the calling thread, the units in others."""
    runner = kit.runner(limit=4)
    assert isinstance(runner, ThreadOffloadRunner)
    bar = RecordingProgress()
    threads: set[int] = set()
    unit_threads: set[int] = set()
    select = kit.select(1)

    def unit(session: Any) -> int:
        unit_threads.add(threading.get_ident())
        return int(select(session))

    report = runner.run_sync(
        [unit] * 100, progress=bar, on_outcome=lambda o: threads.add(threading.get_ident())
    )
    assert report.stats.succeeded == 100
    assert threads == {threading.get_ident()}
    assert threading.get_ident() not in unit_threads
    assert {thread for _, thread, _ in bar.refreshes} == {threading.get_ident()}
    assert "100/100" in bar.text().splitlines()[-1]


@pytest.mark.parametrize(("kind", "anyio_backend"), [("semaphore", "asyncio")], ids=["semaphore"])
async def test_progress_true_prints_nothing_where_stderr_is_not_a_terminal(
    kit: Kit, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under CI (stderr a pipe or file) progress=True draws nothing; on a terminal it draws the bar."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "FORCE_TERMINAL"):
        monkeypatch.delenv(name, raising=False)
    runner = kit.runner(limit=3)
    await runner.run([kit.select(i) for i in range(40)], progress=True)
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: treat stderr as a terminal
    monkeypatch.setenv("COLUMNS", "200")  # one line (an 80-column terminal folds the counts)
    await runner.run([kit.select(i) for i in range(40)], progress="backfill")
    drawn = capfd.readouterr().err
    assert "backfill" in drawn
    assert "40/40" in drawn
    assert "0 failed" in drawn
    assert "in flight" in drawn


@pytest.mark.parametrize(("kind", "anyio_backend"), [("semaphore", "asyncio")], ids=["semaphore"])
async def test_a_cancelled_run_stops_its_bar(kit: Kit, admin: Engine, app_name: str) -> None:
    """Cancelling a run with a bar stops the bar and leaks nothing."""
    runner = kit.runner(limit=3)
    bar = RecordingProgress()
    told: list[int] = []
    # Cancelled once 3 units have settled (a fixed 0.5 s saw none settle on a busy machine).
    with anyio.CancelScope() as scope:

        def on_outcome(outcome: Outcome[Any]) -> None:
            told.append(outcome.index)
            if len(told) == 3:
                scope.cancel()

        units = [kit.insert(i, sleep=0.2) for i in range(100)]
        await runner.run(units, progress=bar, on_outcome=on_outcome)
    assert scope.cancelled_caught
    assert not bar.live.is_started
    assert 3 <= bar.tasks[0].completed < 100
    assert len(told) == bar.tasks[0].completed
    assert kit.pool.checkedout() == 0
    assert eventually(lambda: idle_in_transaction(admin, app_name) == 0, 2)


@pytest.mark.parametrize(("kind", "anyio_backend"), [("semaphore", "asyncio")], ids=["semaphore"])
async def test_bad_watch_arguments_name_the_fix(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """on_outcome must be callable, progress a bool, a label or a Progress; a bar needs rich."""
    runner = kit.runner(limit=2)
    units = [kit.select(1)]
    with pytest.raises(TypeError, match=r"^on_outcome must be a function that takes an Outcome"):
        await runner.run(units, on_outcome=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^progress must be True, False, a label \(str\) or a rich"):
        await runner.run(units, progress=5)  # type: ignore[arg-type]
    # As if rich were not installed: the display module is imported afresh, and its import of rich fails.
    monkeypatch.delitem(sys.modules, "boundeddb._rich_display")
    monkeypatch.delattr(boundeddb, "_rich_display")
    for name in [name for name in sys.modules if name == "rich" or name.startswith("rich.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'boundeddb\[progress\]'"):
        await runner.run(units, progress=True)
    assert kit.pool.checkedout() == 0
    assert (await runner.run(units)).values() == [1]
