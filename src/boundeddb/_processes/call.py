"""
One ``ProcessRunner.map()`` call on the parent's side: items out to the workers until all have settled.

:func:`run_map` is a method of :class:`~boundeddb.ProcessRunner`, which binds it as ``_map``.
``runner.py`` imports this module, so :class:`MapRunner` names what it reads of the runner rather
than importing it.
"""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from time import perf_counter
from typing import Any, Protocol

import anyio
from sqlalchemy.engine import URL

from .._arguments import ErrorsMode
from .._core.journalled import Foregone, foregone_outcome
from .._core.recorder import LoopLag
from .._core.run import failures_error
from .._dialects import for_name
from .._errors import UnpicklableError
from .._outcome import Outcome, RunReport
from .._runners.journal_units import JournalCall, check_journal
from .._stats import RunStats, percentile
from .._telemetry import active
from . import protocol as p
from .fleet import Fleet, Link
from .ledger import Ledger
from .lookups import WorkerLookups
from .plan import check_driver, check_fn
from .protocol import Kind, most_handed

__all__ = ["CANCEL_GRACE_S", "Call", "MapRunner", "run_map"]

#: How many seconds a cancelled call waits for its workers to roll back before it kills them.
CANCEL_GRACE_S = 30.0
_END = object()


class _Input:
    """Pulls items from a sync or async iterable, one at a time."""

    def __init__(self, items: Iterable[Any] | AsyncIterable[Any]) -> None:
        self._sync: Iterator[Any] | None = None
        self._async: AsyncIterator[Any] | None = None
        if isinstance(items, AsyncIterable):
            self._async = aiter(items)
        else:
            self._sync = iter(items)

    async def next(self) -> Any:
        if self._sync is not None:
            return next(self._sync, _END)
        assert self._async is not None
        return await anext(self._async, _END)


class Call:
    """Hands a call's items to the workers as they have room, and waits until every unit has settled."""

    def __init__(
        self,
        fleet: Fleet,
        kind: Kind,
        fn: bytes,
        *,
        stop_on_failure: bool,
        verify: bool,
        attributes: Mapping[str, str],
        journal: JournalCall | None = None,
    ) -> None:
        self.fleet = fleet
        #: With ``journal=``: the items come keyed, ``(item, key)``, or settled, from its lookups.
        self._journal = journal
        telemetry = active()
        call_telemetry = None
        carrier: dict[str, str] | None = None
        if telemetry is not None:  # metrics here, and the workers make the spans under the caller's
            call_telemetry = telemetry.call(attributes, is_async=kind is Kind.ASYNC, spans=False)
            carrier = telemetry.carrier()
        self.ledger = ledger = Ledger(
            kind,
            stop_on_failure=stop_on_failure,
            verify=verify,
            totals=fleet.totals,
            telemetry=call_telemetry,
        )
        fleet.register(ledger)
        spec = None if journal is None else (journal.job, journal.journal.table)
        self._call_message = pickle.dumps(p.CallBegins(ledger.id, kind.value, fn, carrier, spec))
        #: Workers told to stop or close the call, and those told to cancel it.
        self._told: set[Link] = set()
        self._cancel_told: set[Link] = set()
        self.exhausted = False
        self.input_error: BaseException | None = None
        self._next_index = 0
        self._started = perf_counter()

    async def run(self, items: Iterable[Any] | AsyncIterable[Any]) -> None:
        """Hand the items out until every unit has settled and every worker closed the call."""
        pull = _Input(items if self._journal is None else self._journal.keyed(items))
        try:
            while True:
                await self._hand_out(pull)
                if self._finished():
                    return
                await self.ledger.wait()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._cancel()
            raise
        finally:
            self.fleet.unregister(self.ledger)
            self.ledger.close()

    def report(self, limit: int, loop_lag: LoopLag | None) -> RunReport[Any]:
        """The call's report, or what it owes its caller: the input's error, a worker's, or RunFailed."""
        ledger = self.ledger
        elapsed = perf_counter() - self._started
        outcomes = sorted(ledger.outcomes, key=lambda outcome: outcome.index)
        latencies = sorted(outcome.latency_s for outcome in outcomes if not outcome.skipped)
        skipped = sum(1 for outcome in outcomes if outcome.skipped)
        succeeded = sum(1 for outcome in outcomes if outcome.error is None) - skipped
        lag_p99, lag_max = loop_lag.summary() if loop_lag is not None else (None, None)
        stats = RunStats(
            submitted=len(outcomes) - skipped,
            succeeded=succeeded,
            failed=len(outcomes) - skipped - succeeded,
            elapsed_s=elapsed,
            throughput=(len(outcomes) - skipped) / elapsed if elapsed > 0 else 0.0,
            latency_p50_s=percentile(latencies, 0.50),
            latency_p95_s=percentile(latencies, 0.95),
            latency_p99_s=percentile(latencies, 0.99),
            latency_max_s=latencies[-1] if latencies else 0.0,
            peak_in_flight=sum(units for _, units in ledger.peaks.values()),
            peak_connections=sum(connections for connections, _ in ledger.peaks.values()),
            loop_lag_p99_s=lag_p99,
            loop_lag_max_s=lag_max,
            retried=sum(max(0, outcome.attempts - 1) for outcome in outcomes),
            limit_min=limit,
            limit_max=limit,
            limit_final=limit,
            limit_trace=((0.0, limit),),
            commits_verified=sum(1 for outcome in outcomes if outcome.commit_verified),
            batches_committed=sum(committed for committed, _ in ledger.batches.values()),
            units_rerun=sum(rerun for _, rerun in ledger.batches.values()),
            skipped=skipped,
        )
        report = RunReport(outcomes, stats)
        if self.input_error is not None:
            raise self.input_error
        if ledger.error is not None:
            raise ledger.error
        if ledger.stop_on_failure and (failed := failures_error(report)) is not None:
            raise failed
        return report

    def _room(self) -> dict[Link, int]:
        """How many more units each serving worker takes now, under the lock: see ``most_handed``."""
        return {
            link: most_handed(link.seat.units) - link.handed
            for link in self.fleet.ready_links()
            if link.handed <= link.seat.units
        }

    async def _pull(self, pull: _Input, wanted: int) -> list[tuple[int, bytes]]:
        """Up to ``wanted`` new items, numbered and pickled. One that cannot be pickled settles here."""
        ledger, new = self.ledger, list[tuple[int, bytes]]()
        while len(new) < wanted and not self.exhausted:
            try:
                item = await pull.next()
            except Exception as error:  # the caller's input failed: stop, then raise it
                self.input_error, self.exhausted = error, True
                with self.fleet.lock:
                    ledger.stop(draining=True)
                break
            if item is _END:
                self.exhausted = True
                with self.fleet.lock:
                    ledger.drain()
                break
            index = self._next_index
            self._next_index += 1
            if item.__class__ is Foregone:  # done already, or its key is wrong: never handed out
                with self.fleet.lock:
                    ledger.settle(foregone_outcome(item, index))
                if ledger.stopping:
                    break
                continue
            try:
                new.append((index, pickle.dumps(item, pickle.HIGHEST_PROTOCOL)))
            except Exception as error:
                msg = (
                    f"item {index} ({type(item).__qualname__}) cannot be pickled to send it to a worker "
                    f"process ({type(error).__qualname__}: {error}): pass plain data, e.g. ids or tuples"
                )
                with self.fleet.lock:
                    ledger.settle(Outcome(index, None, UnpicklableError(msg), 0.0, 0.0, attempts=0))
                if ledger.stopping:
                    break
        return new

    async def _hand_out(self, pull: _Input) -> None:
        fleet, ledger = self.fleet, self.ledger
        with fleet.lock:
            if fleet.broken is not None:
                ledger.fail(fleet.broken)
            wanted = 0 if ledger.stopping else sum(self._room().values()) - len(ledger.pending)
        new = await self._pull(pull, wanted)
        sends: list[tuple[Link, bytes]] = []
        with fleet.lock:
            ledger.queue(new)
            if ledger.stopping:
                sends += self._tell(p.Stop)
            else:
                now = perf_counter()
                for link, room in self._room().items():
                    handed = ledger.hand(link, room, now)
                    if not handed:
                        continue
                    if ledger.open(link):
                        sends.append((link, self._call_message))
                    sends.append((link, pickle.dumps(p.Units(ledger.id, handed))))
                if self.exhausted and not (ledger.pending or ledger.where or ledger.verifying):
                    sends += self._tell(p.Close)
        for link, data in sends:
            link.send(data)

    def _tell(self, what: type[p.Stop | p.Close]) -> list[tuple[Link, bytes]]:
        """Stop or Close for each worker the call is open on and that was not told yet. Under the lock."""
        links = self.ledger.open_on - self._told
        self._told |= links
        message = pickle.dumps(what(self.ledger.id))
        return [(link, message) for link in links]

    def _finished(self) -> bool:
        ledger = self.ledger
        with self.fleet.lock:
            waiting = ledger.pending and not ledger.stopping
            busy = ledger.where or ledger.verifying or ledger.open_on or waiting
            return (self.exhausted or ledger.stopping) and not busy

    async def _cancel(self) -> None:
        """Cancel the units in flight on every worker, and wait until they are rolled back."""
        fleet, ledger = self.fleet, self.ledger
        with fleet.lock:
            ledger.cancel()
            links = list(ledger.open_on - self._cancel_told)
            self._cancel_told.update(links)
        message = pickle.dumps(p.Cancel(ledger.id))
        for link in links:
            link.send(message)
        await self._until_closed()
        with fleet.lock:
            stuck = list(ledger.open_on)
        for link in stuck:  # its units end with its connections
            link.started.kill()
        await self._until_closed()

    async def _until_closed(self) -> None:
        """Until every worker closed the call or died, at most :data:`CANCEL_GRACE_S`."""
        with anyio.move_on_after(CANCEL_GRACE_S):
            while True:
                with self.fleet.lock:
                    if not self.ledger.open_on:
                        return
                await self.ledger.wait()


class MapRunner(Protocol):
    """What a ``map()`` call reads of its runner, a :class:`~boundeddb.ProcessRunner`."""

    _url: URL
    _engine_options: Mapping[str, Any]
    _fleet: Fleet
    _errors: ErrorsMode
    _verify: bool
    _labels: dict[str, str]
    _limit: int

    def _check_open(self) -> None: ...


async def run_map(
    runner: MapRunner, fn: object, items: object, journal: object, *, measure_loop_lag: bool
) -> RunReport[Any]:
    """One ``map()`` call of ``runner``, from the checks of its arguments to its report."""
    kind, fn_bytes = check_fn(fn)
    check_driver(kind, runner._url)
    if not isinstance(items, (Iterable, AsyncIterable)) or isinstance(items, (str, bytes)):
        msg = (
            f"items must be an iterable or async iterable, got {type(items).__name__}: "
            "pass e.g. a list or a generator of the items to give fn, as runner.map(fn, items)"
        )
        raise TypeError(msg)
    checked: Iterable[Any] | AsyncIterable[Any] = items
    journalled = None if journal is None else check_journal(journal, "ProcessRunner")
    runner._check_open()
    journal_call = None
    if journalled is not None:  # its keys looked up by the workers, within the limit
        lookups = WorkerLookups(runner._fleet, kind, journalled, for_name(runner._url.get_dialect().name))
        journal_call = JournalCall(journalled, None, async_units=kind is Kind.ASYNC, lookups=lookups)
    runner._fleet.start()
    call = Call(
        runner._fleet,
        kind,
        fn_bytes,
        stop_on_failure=runner._errors == "raise",
        verify=runner._verify,
        attributes=runner._labels,
        journal=journal_call,
    )
    loop_lag = LoopLag() if measure_loop_lag else None
    async with anyio.create_task_group() as tasks:
        if loop_lag is not None:
            tasks.start_soon(loop_lag.tick_forever)
        await call.run(checked)
        tasks.cancel_scope.cancel()
    return call.report(runner._limit, loop_lag)
