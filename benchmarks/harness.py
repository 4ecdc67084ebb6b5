"""
The measuring harness: a scenario's context and the probe that times it.

A :class:`Probe` wraps the timed part of a scenario (``with`` for sync code, ``async with``
where an event loop runs, which also starts a loop-lag ticker).  While it is open a
:class:`~benchmarks.db.sampler.Sampler` thread on its own connection counts, every 100 ms, the
server connections whose application_name is the scenario's (on MySQL/MariaDB: those on the
suite's database), reads the CPU time of those backends (MariaDB: of their server threads) from
/proc, samples this process's RSS, and moves the progress bar.  On exit the probe appends one
:class:`Measurement` to the context, or one that records the error, so a failing scenario never
stops the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from rich.progress import Progress, TaskID

from .db import Server
from .db.postgresql import APP_PREFIX
from .db.sampler import Sampler
from .measurement import Measurement, done_line, error_line
from .stats import percentile
from .workload import Op

#: The loop-lag ticker's period; the same 5 ms timer boundeddb's RunStats uses.
TICK_INTERVAL_S = 0.005


@dataclass
class Context:
    """What every scenario gets: the database, the op sequence, settings, and the results."""

    db: Server
    ops: list[Op]
    seed: int
    limit: int
    sweep_n: int
    memory_units: int
    loop_lag_requests: int
    overhead_rounds: int = 5
    #: Rounds of the auto-limit scenario's comparisons.
    auto_rounds: int = 3
    #: Passes of the limit sweep (the auto-limit scenario's best fixed limit: the best on average).
    sweep_passes: int = 1
    #: Rounds of the post-002 scenario.
    post_002_rounds: int = 10
    #: Rounds of the processes scenario.
    processes_rounds: int = 3
    #: Rounds of the batching scenario.
    batching_rounds: int = 3
    #: Rounds of the journal scenario.
    journal_rounds: int = 3
    #: Rows of the load scenario, and its rounds.
    load_rows: int = 200_000
    load_rounds: int = 3
    #: The overhead pairs the instructions scenario counts.
    instructions_pairs: tuple[str, ...] = ()
    progress: Progress | None = None
    #: Whether probes sample pg_stat_activity in a thread (off under callgrind: see instructions.py).
    sampling: bool = True
    index: bool = False
    results: list[Measurement] = field(default_factory=list)

    @property
    def schema(self) -> str:
        return "index" if self.index else "faithful"

    def app_name(self, label: str) -> str:
        """The application_name that marks (and only marks) this scenario's connections."""
        slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        return f"{APP_PREFIX}-{slug}-{self.schema}"[:63]

    def reset(self) -> None:
        """Fresh tables, in this pass's schema variant."""
        self.db.reset_schema(index=self.index)

    def failed(
        self, scenario: str, label: str, error: BaseException | str, *, group: str = "main", **config: Any
    ) -> Measurement:
        """Record a row that ``error`` stopped (the run goes on), and say so in the progress lines."""
        shown = error if isinstance(error, str) else error_line(error)
        m = Measurement(scenario, label, group=group, schema=self.schema, config=config, error=shown)
        self.results.append(m)
        self.log(f"{label}: FAILED: {shown}")
        return m

    def log(self, message: str) -> None:
        """A progress line, on stderr now (above the bars on a terminal): never held in a buffer."""
        if self.progress is not None:
            self.progress.console.print(message, highlight=False, markup=False)
        else:
            print(message, file=sys.stderr, flush=True)


class LoopLagTicker:
    """A task that records how late the event loop runs a 5 ms timer."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(TICK_INTERVAL_S)
            self.lags.append(max(0.0, time.perf_counter() - start - TICK_INTERVAL_S))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class SuiteProgress(Progress):
    """The suite's progress bars; a task a runner adds (``progress=``) takes the next scenario's label."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_label: str | None = None

    def label_next(self, label: str) -> None:
        self._next_label = label

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        label, self._next_label = self._next_label, None
        return super().add_task(label or description, *args, **kwargs)


class Probe:
    """Times one scenario run; see the module docstring."""

    def __init__(
        self,
        ctx: Context,
        scenario: str,
        label: str,
        *,
        total: int,
        app_name: str,
        group: str = "main",
        config: dict[str, Any] | None = None,
        bar: bool = True,
    ) -> None:
        self.ctx, self.app_name, self.done = ctx, app_name, 0
        #: Whether the probe draws the scenario's bar from tick(); False: a runner draws it (see
        #: runner_progress), and the units do not tick.
        self._bar = bar
        suffix = " [index]" if ctx.index and group == "main" else ""
        self.m = Measurement(
            scenario=scenario,
            label=label + suffix,
            group=group,
            schema=ctx.schema,
            n=total,
            config={"application_name": app_name, **(config or {})},
        )
        #: Set by the scenario: one latency per unit (or a Reservoir's sample).
        self.latencies: Sequence[float] = ()
        self.succeeded: int | None = None
        self.failed = 0
        self._task: TaskID | None = None
        self._ticker: LoopLagTicker | None = None
        self._end: tuple[float, float] | None = None

    def runner_progress(self) -> Progress | bool:
        """
        What to pass a boundeddb runner as ``progress=``: the suite's bars, where the runner adds a
        task labelled as this scenario and keeps it up to date itself; ``False`` off a terminal.
        """
        progress = self.ctx.progress
        if progress is None:
            return False
        if isinstance(progress, SuiteProgress):
            progress.label_next(self.m.label)
        return progress

    def tick(self) -> None:
        """One unit done (for the progress bar only)."""
        self.done += 1

    def show_progress(self) -> None:
        if self.ctx.progress is not None and self._task is not None:
            self.ctx.progress.update(self._task, completed=self.done)

    def __enter__(self) -> Probe:
        if self.ctx.progress is not None and self._bar:
            self._task = self.ctx.progress.add_task(self.m.label, total=self.m.n)
        self._sampler = Sampler(self.ctx.db, self.app_name, self.show_progress)
        self._sampler.sample()
        if self.ctx.sampling:
            self._sampler.start()
        self._cpu0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        end = self._end or (time.perf_counter(), time.process_time())
        wall, cpu = end[0] - self._t0, end[1] - self._cpu0
        self._sampler.finish()
        m = self.m
        m.wall_s, m.client_cpu_s = wall, cpu
        m.connections = self._sampler.series
        m.peak_connections = max((c for _, c in m.connections), default=0)
        m.server_cpu_s = self._sampler.server_cpu()
        m.rss_growth_mb = (self._sampler.rss_peak - self._sampler.rss0) / 2**20
        if self._sampler.error:
            m.extra["sampler_error"] = self._sampler.error
        m.extra["loadavg_1m"] = round(os.getloadavg()[0], 2)  # the machine's, ours included
        m.p50_s = percentile(self.latencies, 0.50)
        m.p99_s = percentile(self.latencies, 0.99)
        m.max_s = max(self.latencies, default=None)
        m.succeeded = self.succeeded if self.succeeded is not None else len(self.latencies)
        m.failed = self.failed
        m.ops_per_s = m.succeeded / wall if wall > 0 else None
        if self._ticker is not None:
            m.loop_lag_p99_s = percentile(self._ticker.lags, 0.99)
            m.loop_lag_max_s = max(self._ticker.lags, default=None)
        if exc is not None and isinstance(exc, Exception):
            m.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500]
            self.ctx.log(f"{m.label} FAILED: {m.error}")
        else:
            self.ctx.log(f"  {m.label}: {done_line(m)}")
        if self.ctx.progress is not None and self._task is not None:
            self.show_progress()
            self.ctx.progress.stop_task(self._task)
        self.ctx.results.append(m)
        return exc is not None and isinstance(exc, Exception)

    async def __aenter__(self) -> Probe:
        self.__enter__()
        self._ticker = LoopLagTicker()
        self._ticker.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._end = (time.perf_counter(), time.process_time())
        if self._ticker is not None:
            await self._ticker.stop()
        return self.__exit__(exc_type, exc, tb)
