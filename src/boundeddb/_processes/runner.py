"""ProcessRunner: units spread over worker processes or a Dask cluster under one connection budget."""

from __future__ import annotations

import types
import weakref
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any, final, overload

import anyio
import anyio.lowlevel
import anyio.to_thread
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from .._arguments import ErrorsMode, check_errors
from .._batch import BatchPolicy
from .._errors import RunnerClosedError
from .._journal import Journal
from .._outcome import RunReport
from .._retry import RetryPolicy
from .._runners.binding import run_blocking
from .._stats import RunnerStatistics
from .._telemetry import labels, register
from .._typing import ItemT, T
from .call import run_map
from .fleet import Fleet
from .plan import Plan

__all__ = ["ProcessRunner"]


@final
class ProcessRunner:
    """
    Run ``fn(session, item)`` for many items in worker processes, under one connection budget.

    One Python process is one core of ORM work: when the client's CPU, not the database, is what a
    backfill or an import waits for, spread it over processes or over a Dask cluster's workers. Each
    worker builds its engine once, with a pool of exactly its share of ``limit``, and runs its units
    as the in-process runners do: :class:`~boundeddb.SemaphoreRunner` for ``async def fn``,
    :class:`~boundeddb.ThreadOffloadRunner` for a plain ``def fn``. So units in flight, and
    connections, over all workers never exceed ``limit``. Each unit gets its own session and
    transaction, committed if ``fn`` returns and rolled back if it raises.

    Workers are started with ``spawn`` when the runner is entered or at its first call, and serve
    every call until the runner is closed. Nothing is forked: no engine, loop or connection crosses
    a process boundary. Items and ``fn`` are pickled. ``fn`` must be a module-level function, or a
    :func:`functools.partial` of one, that workers import by name, and a program that creates the
    runner needs an ``if __name__ == "__main__":`` guard. See :doc:`/how-to/processes`.

    Args:
        url: The database URL each worker builds its engine from. Its driver decides async or sync
            units, and ``postgresql+psycopg`` serves both.
        limit: The whole budget: units in flight, and connections, over all workers.
        processes: How many workers. Defaults to ``min(cores, limit)``, counting the cluster's
            workers instead of the cores with ``cluster``. At most ``limit``.
        engine_options: Picklable keyword arguments for each worker's ``create_engine`` or
            ``create_async_engine``. ``pool_size`` and ``max_overflow`` are the runner's.
        errors: ``"raise"`` or ``"collect"``, as for :class:`~boundeddb.SemaphoreRunner`.
        retry: See :class:`~boundeddb.RetryPolicy`. It must be picklable: a module-level ``retry_on``.
        timeout: Seconds each unit attempt may take, as for the in-process runners.
        verify_commits: As for :class:`~boundeddb.SemaphoreRunner`. It also resolves the COMMIT of a
            unit whose worker died while committing it.
        cluster: A Dask :class:`distributed.Client`, from ``pip install 'boundeddb[dask]'``. Workers
            run as long-lived tasks on its workers, each connecting back to this process, in TLS
            with the cluster's certificates when the client uses TLS: see the Security section of
            :doc:`/how-to/processes`.
        batch: As for :class:`~boundeddb.SemaphoreRunner`. Each worker puts up to ``size`` of its
            units in one transaction, so ``limit`` still bounds connections. A unit whose worker
            dies while its batch commits is ``commit_unknown``, as every unit of that batch is.
            *New in 0.3.0.*

    A worker that dies, to the OOM killer or a SIGKILL, loses and repeats nothing. The units it had
    started fail with :class:`~boundeddb.WorkerLostError`, and are ``commit_unknown`` where its COMMIT
    may have been sent. The units it had been handed but not started run on other workers, and a new
    worker takes its place.

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        url: str | URL,
        *,
        limit: int,
        processes: int | None = None,
        engine_options: Mapping[str, Any] | None = None,
        errors: ErrorsMode = "raise",
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        verify_commits: bool = False,
        cluster: Any = None,
        batch: int | BatchPolicy | None = None,
    ) -> None:
        plan = Plan.of(url, limit, processes, engine_options, retry, timeout, verify_commits, cluster, batch)
        self._limit, self._processes, self._url, self._verify = (
            plan.limit,
            plan.processes,
            plan.url,
            plan.verify,
        )
        self._errors = check_errors(errors)
        self._fleet = Fleet(plan.backend, plan.configs)
        self._labels = labels("ProcessRunner", plan.url.get_dialect().name)
        register(self, self._labels)
        self._engine_options: Mapping[str, Any] = dict(engine_options or {})
        self._closed = False
        self._finalizer = weakref.finalize(self, self._fleet.close)

    @property
    def limit(self) -> int:
        """The most units in flight, and connections, over all workers at once."""
        return self._limit

    @property
    def processes(self) -> int:
        """How many workers the runner keeps."""
        return self._processes

    def statistics(self) -> RunnerStatistics:
        """
        What the runner's calls hold and what waits now, and its counters since it was made.

        As :meth:`boundeddb.SemaphoreRunner.statistics`: ``in_flight`` counts the units the workers
        said they started, ``waiting`` those pulled and not started yet. It has no priorities.
        """
        in_flight, waiting = self._fleet.figures()
        empty: Mapping[int, int] = types.MappingProxyType({})
        return RunnerStatistics(
            self._limit, 0, in_flight, waiting, empty, empty, **self._fleet.totals.figures()
        )

    def __repr__(self) -> str:
        with self._fleet.lock:
            ready = len(self._fleet.ready_links())
        state = " closed" if self._closed else ""
        return f"<ProcessRunner limit={self._limit} processes={self._processes} ready={ready}{state}>"

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers now rather than at the first call, without waiting for them to be ready."""
        self._check_open()
        self._fleet.start()

    async def aclose(self) -> None:
        """Wait for the calls in progress, then end every worker and its connections."""
        self._closed = True
        await anyio.to_thread.run_sync(self._finalizer)

    def close(self) -> None:
        """The sync twin of :meth:`aclose`."""
        self._closed = True
        self._finalizer()

    async def __aenter__(self) -> ProcessRunner:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> ProcessRunner:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RunnerClosedError("this ProcessRunner is closed: create a new runner")

    # -- the verbs ------------------------------------------------------------------------------------

    @overload
    async def map(
        self,
        fn: Callable[[AsyncSession, ItemT], Awaitable[T]],
        items: Iterable[ItemT] | AsyncIterable[ItemT],
        *,
        journal: Journal[ItemT] | None = None,
    ) -> RunReport[T]: ...

    @overload
    async def map(
        self,
        fn: Callable[[Session, ItemT], T],
        items: Iterable[ItemT] | AsyncIterable[ItemT],
        *,
        journal: Journal[ItemT] | None = None,
    ) -> RunReport[T]: ...

    async def map(
        self,
        fn: Callable[[Any, Any], Any],
        items: Iterable[Any] | AsyncIterable[Any],
        *,
        journal: Journal[Any] | None = None,
    ) -> RunReport[Any]:
        """
        Run ``fn(session, item)`` for every item in the workers, each unit in its own session and transaction.

        Items are pulled lazily and sent to the workers in groups that keep each one busy, with at
        most three times its share handed to it at once. Awaiting it never blocks the event loop,
        under asyncio or trio.

        Args:
            fn: A module-level ``async def fn(session: AsyncSession, item)`` or
                ``def fn(session: Session, item)``.
                Its value must be picklable.
            items: Iterable or async iterable of picklable items.
            journal: As for :meth:`boundeddb.SemaphoreRunner.map`: the parent computes the keys and
                has a worker look them up, within its share of ``limit``, and never hands out an
                item that is done; each worker writes its units' rows. ``key`` runs in the parent and
                need not be picklable. *New in 0.3.0.*

        Returns:
            A :class:`~boundeddb.RunReport` in input order, with stats merged over all workers.
            With ``errors="raise"``, units handed to a worker but not started when the first failure
            was seen have no outcome, so ``outcomes[i].index`` may skip them.

        Raises:
            RunFailed: with ``errors="raise"``, after the first failure, as for the other runners.
            WorkerStartError: the workers could not be started.

        Cancelling the call cancels the units in flight on every worker and waits for them before it
        propagates. They roll back: nothing commits after a worker has seen the cancellation.
        """
        return await self._map(fn, items, journal, measure_loop_lag=True)

    @overload
    def map_sync(
        self,
        fn: Callable[[AsyncSession, ItemT], Awaitable[T]],
        items: Iterable[ItemT],
        *,
        journal: Journal[ItemT] | None = None,
    ) -> RunReport[T]: ...

    @overload
    def map_sync(
        self,
        fn: Callable[[Session, ItemT], T],
        items: Iterable[ItemT],
        *,
        journal: Journal[ItemT] | None = None,
    ) -> RunReport[T]: ...

    def map_sync(
        self, fn: Callable[[Any, Any], Any], items: Iterable[Any], *, journal: Journal[Any] | None = None
    ) -> RunReport[Any]:
        """
        Run :meth:`map` from plain sync code and return its report.

        Ctrl-C, a :exc:`KeyboardInterrupt`, cancels the units in flight on every worker before it
        propagates. The workers themselves ignore it.

        Raises:
            RuntimeError: if called from async code. There, ``await runner.map(fn, items)`` instead.
        """
        call = partial(self._map, fn, items, journal, measure_loop_lag=False)
        report: RunReport[Any] = run_blocking(call, "map_sync", "await runner.map(fn, items)")
        return report

    #: The body that ``map()`` and ``map_sync()`` share: see ``call.py``.
    _map = run_map
