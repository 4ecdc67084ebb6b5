"""The parent's engine for a ProcessRunner call's journal lookups: one connection beside the workers'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio.to_thread
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .._dialects import for_name
from .._journal import Journal
from .._runners.journal_units import JournalCall

__all__ = ["Lookups"]


class Lookups:
    """
    The engine a ``map()`` call with ``journal=`` looks its keys up on, for that call only.

    An async driver's connections belong to the event loop that made them, and each ``map_sync()``
    runs a loop of its own: so the engine lives as long as the call.
    """

    def __init__(self, url: URL, engine_options: Mapping[str, Any]) -> None:
        options = dict(engine_options)
        if "poolclass" not in options:  # one connection, beside the workers' limit
            options.update(pool_size=1, max_overflow=0)
        self._async_engine: AsyncEngine | None = None
        if url.get_dialect().is_async:
            self._async_engine = create_async_engine(url, **options)
            self._engine: Engine = self._async_engine.sync_engine
        else:
            self._engine = create_engine(url, **options)

    def call(self, journal: Journal[Any]) -> JournalCall:
        """A call of ``journal``: its keys looked up in the parent, its rows written by the workers."""
        engine = self._engine
        dialect = for_name(engine.dialect.name)
        return JournalCall.on(journal, engine, dialect, async_units=engine.dialect.is_async)

    async def aclose(self) -> None:
        """Close the engine's connection, on the loop that made it."""
        if self._async_engine is not None:
            await self._async_engine.dispose()
        else:
            await anyio.to_thread.run_sync(self._engine.dispose)
