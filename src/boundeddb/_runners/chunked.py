"""ChunkedRunner: async units gathered ``chunk_size`` at a time, with a barrier between chunks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, final

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import async_sessionmaker

from .._arguments import ErrorsMode
from .._batch import BatchPolicy
from .._core.pacing import Chunks
from .._outcome import Outcome
from .._retry import RetryPolicy
from .async_units import AsyncUnitsRunner
from .pools import pool_capacity, resolve_limit


@final
class ChunkedRunner(AsyncUnitsRunner):
    """
    Run async units in chunks: start ``chunk_size`` units, wait for all of them, then the next chunk.

    This is the pattern of the "async chunks of 40" benchmark that bounded concurrency with
    :func:`asyncio.gather`. It is kept as a baseline and for jobs shaped in rounds.
    While the slowest unit of a chunk runs, the chunk's other slots stay idle, so
    :class:`~boundeddb.SemaphoreRunner` usually finishes sooner with the same number of connections.
    Concurrent calls on one runner share its ``chunk_size`` slots.

    Args:
        sessions: The :class:`~sqlalchemy.ext.asyncio.async_sessionmaker` each unit's session
            comes from. It must be bound to one engine.
        chunk_size: Units per chunk, and so most in flight at once. At most the pool's capacity.
            Defaults to 40, the benchmark's chunk, or to the pool's capacity if that is smaller,
            so that ``ChunkedRunner(sessions)`` works on a default engine, whose capacity is 15.
        errors: ``"raise"`` or ``"collect"``, as for :class:`~boundeddb.SemaphoreRunner`.
        retry: See :class:`~boundeddb.RetryPolicy`.
        timeout: Seconds each unit attempt may take.
        reserve: Slots of the limit granted only to calls with ``priority > 0``. *New in 0.2.0.*
            A priority-0 run's chunks hold ``chunk_size - reserve`` units, so a request's
            ``submit(unit, priority=1)`` finds a slot free while a bulk run saturates the rest.
            Must be less than ``chunk_size``. See :doc:`/how-to/priorities`.
        verify_commits: As for :class:`~boundeddb.SemaphoreRunner`. *New in 0.2.0.*
        on_outcome: As for :class:`~boundeddb.SemaphoreRunner`. *New in 0.2.0.*
        batch: As for :class:`~boundeddb.SemaphoreRunner`. A chunk is then ``chunk_size`` batches,
            with the barrier between chunks. *New in 0.3.0.*

    .. versionadded:: 0.1.0
    """

    _limit_name = "chunk_size"

    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        *,
        chunk_size: int | None = None,
        errors: ErrorsMode = "raise",
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        reserve: int = 0,
        verify_commits: bool = False,
        on_outcome: Callable[[Outcome[Any]], object] | None = None,
        batch: int | BatchPolicy | None = None,
    ) -> None:
        super().__init__(
            sessions, chunk_size, errors, retry, timeout, reserve, verify_commits, on_outcome, batch
        )

    def _plan_limit(self, limit: object, engine: Engine) -> int:
        return resolve_limit("chunk_size", _default_chunk(limit, engine), engine, "ChunkedRunner")

    @property
    def chunk_size(self) -> int:
        """Units per chunk."""
        return self._limiter.limit

    def _new_pacer(self, workers: int) -> Chunks:
        return Chunks(workers)


#: The chunk of the "async chunks of 40" benchmark.
DEFAULT_CHUNK_SIZE = 40


def _default_chunk(chunk_size: object, engine: Engine) -> object:
    if chunk_size is not None:
        return chunk_size
    capacity = pool_capacity(engine.pool)
    return DEFAULT_CHUNK_SIZE if capacity is None else min(DEFAULT_CHUNK_SIZE, capacity)
