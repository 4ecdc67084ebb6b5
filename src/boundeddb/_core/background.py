"""Run a stream's producer beside its consumer, and stop it when the consumer stops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

__all__ = ["Background"]


def _on_asyncio() -> bool:
    """Whether the running event loop is asyncio's. Under trio no asyncio loop runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Background:
    """
    ``async with Background(produce):`` runs ``produce()`` while the body consumes what it makes.

    On asyncio the producer is a separate task, so that the consumer's async generator never yields
    inside a task group: breaking out of ``async for`` early is safe there. On trio it is a task group
    around the generator's body. If you may break out early, close the generator promptly with
    ``contextlib.aclosing``.
    """

    def __init__(self, produce: Callable[[], Awaitable[None]]) -> None:
        self._produce = produce
        self._task: asyncio.Task[None] | None = None
        self._group: Any = None

    async def __aenter__(self) -> None:
        if _on_asyncio():
            self._task = asyncio.ensure_future(self._produce())
        else:
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            self._group.start_soon(self._produce)

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._task is not None:
            task = self._task
            if not task.done():
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        elif exc_info[0] is None:
            await self._group.__aexit__(None, None, None)
        else:
            # The consumer left with GeneratorExit, or failed: stop the producer, then let the
            # consumer's exception go on as it was, not wrapped in the task group's own.
            self._group.cancel_scope.cancel()
            await self._group.__aexit__(None, None, None)
