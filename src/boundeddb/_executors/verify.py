"""
Verified commits: with ``verify_commits=True``, the server says what became of a lost COMMIT.

Just before COMMIT, once the unit's pending changes are flushed, the script reads the transaction's
id, with the server's incarnation. If the COMMIT fails with a lost connection or a timeout, a
connection from the same engine asks the server for that transaction's status, still within the
unit's slot, until :data:`WAIT_S` has passed:

- ``committed``: the unit succeeded, by :class:`~boundeddb._core.attempts.CommitVerified`.
- ``aborted``: the attempt failed with nothing committed, and the retry policy decides.
- ``in progress`` or no answer: ask again after a pause.
- ``NULL``, or still unknown when the wait is over: ``commit_unknown``, as without verification.
- ``committed`` of an id that the server may have handed out again, having restarted or recovered
  from a crash since the id was read (:data:`~boundeddb._dialects.base.COMMITTED_SINCE_RESTART`):
  ``commit_unknown`` at once. The dialect's SQL decides what else survives a crash.

``docs/how-to/verify-commits.md`` says when to turn it on and what it costs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from .._core.attempts import CommitUnknown, CommitVerified
from .._dialects import COMMITTED_SINCE_RESTART, Dialect

__all__ = ["WAIT_S", "CommitVerifier", "bind_script", "verified_async", "verified_sync"]

logger = logging.getLogger("boundeddb.verify")

#: How many seconds the runner keeps asking what became of a COMMIT whose connection was lost.
WAIT_S = 10.0
#: The first pause between two questions. It doubles up to :data:`MAX_PAUSE_S`.
FIRST_PAUSE_S = 0.05
MAX_PAUSE_S = 1.0

#: While a task or thread opens a connection to ask: the connect timeout it wants, in seconds.
_CONNECT_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "boundeddb_verify_connect_timeout", default=None
)
_timed_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
_NO_ANSWER = "no answer"
_lock = threading.Lock()


def _time_out_connects(engine: Engine, dialect: Dialect) -> None:
    """Give the connections opened to ask, and only those, the dialect's connect timeout."""
    with _lock:
        if engine in _timed_engines:
            return
        _timed_engines.add(engine)
    driver = engine.dialect.driver

    def on_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        seconds = _CONNECT_TIMEOUT.get()
        if seconds is not None:
            for name, value in dialect.connect_timeout_params(driver, seconds).items():
                cparams.setdefault(name, value)  # the user's own setting wins

    event.listen(engine, "do_connect", on_connect)


class CommitVerifier:
    """Asks the server what became of a transaction, by its id, within a bounded wait."""

    def __init__(self, engine: Engine, dialect: Dialect) -> None:
        assert dialect.current_xid_sql is not None
        self._engine = engine
        self._async_engine = AsyncEngine(engine) if engine.dialect.is_async else None
        self._dialect = dialect
        #: SQL the transaction script reads the transaction's id with.
        self.xid_sql: str = dialect.current_xid_sql
        self.wait_s = WAIT_S
        _time_out_connects(engine, dialect)

    def _verdict(self, unknown: CommitUnknown, index: int, status: object) -> CommitVerified | None:
        if status == "committed":
            logger.info("unit %d: a COMMIT whose connection was lost: the server committed it", index)
            return CommitVerified(unknown.error, committed=True, value=unknown.value)
        if status == "aborted":
            logger.info("unit %d: a COMMIT whose connection was lost: the server aborted it", index)
            return CommitVerified(unknown.error, committed=False)
        if status == COMMITTED_SINCE_RESTART:
            self._give_up(unknown, index, status)
        logger.debug("unit %d: a COMMIT whose connection was lost: %s; asking again", index, status)
        return None

    def _give_up(self, unknown: CommitUnknown, index: int, status: object) -> NoReturn:
        if status is None:
            why = "the server no longer knows its transaction"
        elif status == COMMITTED_SINCE_RESTART:
            why = (
                "the server restarted or recovered from a crash since its transaction id was read, and "
                "says 'committed' of an id it may have handed out again to another transaction"
            )
        elif status == _NO_ANSWER:
            why = f"no answer within {self.wait_s} s"
        else:
            why = f"still {status} after {self.wait_s} s"
        logger.warning("unit %d: a COMMIT whose connection was lost: its fate stays unknown (%s)", index, why)
        raise unknown

    # -- async ---------------------------------------------------------------------------------------

    async def _ask_async(self, sql: str) -> object:
        assert self._async_engine is not None
        async with self._async_engine.connect() as connection:
            return (await connection.exec_driver_sql(sql)).scalar()

    async def resolve_async(self, unknown: CommitUnknown, index: int) -> NoReturn:
        """Raise :class:`CommitVerified` if the server answers within the wait, else ``unknown``."""
        assert unknown.xid is not None
        sql = self._dialect.xact_status_sql(unknown.xid)
        deadline = time.monotonic() + self.wait_s
        pause = FIRST_PAUSE_S
        token = _CONNECT_TIMEOUT.set(max(0.5, self.wait_s))
        try:
            while True:
                status: object = _NO_ANSWER
                try:
                    left = max(0.1, deadline - time.monotonic())
                    status = await asyncio.wait_for(self._ask_async(sql), left)
                except Exception as error:  # the server is down or unreachable: ask again
                    logger.debug("asking what became of a COMMIT failed: %s", type(error).__qualname__)
                verdict = self._verdict(unknown, index, status)
                if verdict is not None:
                    raise verdict from None
                if status is None or time.monotonic() + pause > deadline:
                    self._give_up(unknown, index, status)
                await asyncio.sleep(pause)
                pause = min(2 * pause, MAX_PAUSE_S)
        finally:
            _CONNECT_TIMEOUT.reset(token)

    # -- sync, in the unit's worker thread ---------------------------------------------------------

    def _ask_sync(self, sql: str) -> object:
        with self._engine.connect() as connection:
            return connection.exec_driver_sql(sql).scalar()

    def resolve_sync(self, unknown: CommitUnknown, index: int, cancelled: Callable[[], bool]) -> NoReturn:
        """As :meth:`resolve_async`, blocking. It gives up at once when the run is ``cancelled()``."""
        assert unknown.xid is not None
        sql = self._dialect.xact_status_sql(unknown.xid)
        deadline = time.monotonic() + self.wait_s
        pause = FIRST_PAUSE_S
        token = _CONNECT_TIMEOUT.set(max(0.5, self.wait_s))
        try:
            while True:
                status: object = _NO_ANSWER
                try:
                    status = self._ask_sync(sql)
                except Exception as error:
                    logger.debug("asking what became of a COMMIT failed: %s", type(error).__qualname__)
                verdict = self._verdict(unknown, index, status)
                if verdict is not None:
                    raise verdict from None
                if status is None or cancelled() or time.monotonic() + pause > deadline:
                    self._give_up(unknown, index, status)
                time.sleep(pause)  # a worker thread's own wait, never the event loop's
                pause = min(2 * pause, MAX_PAUSE_S)
        finally:
            _CONNECT_TIMEOUT.reset(token)


def bind_script(
    script: Callable[..., Any],
    verified: Callable[..., Any],
    engine: Engine,
    dialect: Dialect,
    verify_commits: bool,
    *args: Any,
) -> Callable[..., Any]:
    """
    ``script`` with its leading ``args`` bound, then the SQL that reads the transaction's id.

    Without ``verify_commits`` that SQL is ``None``. With it, the script is wrapped by ``verified``,
    which is ``verified_async`` or ``verified_sync``.

    Called once per runner: without ``verify_commits`` the per-unit path is the bare script.
    """
    if not verify_commits:
        return functools.partial(script, *args, None)
    verifier = CommitVerifier(engine, dialect)
    return functools.partial(verified, functools.partial(script, *args, verifier.xid_sql), verifier)


async def verified_async(
    attempt: Callable[[Any, Any, int], Awaitable[Any]],
    verifier: CommitVerifier,
    worker: Any,
    unit: Any,
    index: int,
) -> Any:
    """One async attempt whose lost COMMIT, if any, is looked up once its session is closed."""
    try:
        return await attempt(worker, unit, index)
    except CommitUnknown as unknown:
        if unknown.xid is None:  # it wrote nothing: nothing of it can have been committed
            raise CommitVerified(unknown.error, committed=False) from None
        try:
            await verifier.resolve_async(unknown, index)
        except asyncio.CancelledError:
            # The run was stopped while it asked. The COMMIT was sent, so the unit must settle: unknown,
            # as resolve_sync gives up on ``cancelled()``; the stop takes effect at the worker's next await.
            logger.warning(
                "unit %d: a COMMIT whose connection was lost: its fate stays unknown (cancelled)", index
            )
            worker.cancel_again()
            raise unknown from None


def verified_sync(
    script: Callable[[Any, Any, int], Any], verifier: CommitVerifier, guard: Any, unit: Any, index: int
) -> Any:
    """One attempt in a thread whose lost COMMIT, if any, is looked up once its session is closed."""
    try:
        return script(guard, unit, index)
    except CommitUnknown as unknown:
        if unknown.xid is None:  # it wrote nothing: nothing of it can have been committed
            raise CommitVerified(unknown.error, committed=False) from None
        verifier.resolve_sync(unknown, index, lambda: bool(guard.cancelled))
