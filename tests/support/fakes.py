"""A fake executor for the core's tests: units are ``async def unit(index)``, run inline, no database."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc

from boundeddb._core.attempts import Attempts
from boundeddb._core.limiter import Slot
from boundeddb._core.pacing import Body, Worker, serve_one
from boundeddb._core.run import Run


class FakeTeam:
    def __init__(self) -> None:
        self._group: anyio.abc.TaskGroup | None = None

    async def run(self, workers: list[Worker], body: Body[Worker]) -> None:
        async with anyio.create_task_group() as self._group:
            for worker in workers:
                self._group.start_soon(body, worker)

    def spawn(self, worker: Worker, body: Body[Worker]) -> None:
        assert self._group is not None
        self._group.start_soon(body, worker)


class FakeExecutor:
    """Runs ``async def unit(index)`` inline; refuses what is not callable."""

    def __init__(self, attempts: Attempts) -> None:
        self._attempts = attempts

    def check(self, unit: object, index: int) -> str | None:
        return None if callable(unit) else f"unit {index} is not callable"

    def worker(self, slot: Slot) -> Worker:
        return Worker(slot)

    def team(self, run: Run[Any], *, alone: bool = False) -> FakeTeam:
        return FakeTeam()

    async def serve(self, run: Run[Any], worker: Worker, wait_s: float) -> Any:
        return await serve_one(self._attempts, self.attempt, run, worker, wait_s)

    async def attempt(self, worker: Worker, unit: Any, index: int) -> Any:
        return await unit(index)


class NoPool:
    peak = 0

    def close(self) -> None:
        pass
