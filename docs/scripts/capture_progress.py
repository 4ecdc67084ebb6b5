"""
Draw the progress bar of ``progress=True`` into SVG files for docs/how-to/progress.md.

    python docs/scripts/capture_progress.py [URL]

URL defaults to the local PostgreSQL (``postgresql+asyncpg://postgres@127.0.0.1/test``). It runs
a backfill of 3,000 units with ``limit="auto"``, a retry policy, a few units that fail once and a
few that always fail, through the bar's own columns on a recording console, and exports one
frame at 60 % (``docs/_static/progress-running.svg``) and the last (``progress-done.svg``).
"""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from boundeddb import Outcome, RetryPolicy, SemaphoreRunner
from boundeddb._rich_display import default_columns  # the bar progress=True draws

STATIC = Path(__file__).resolve().parent.parent / "_static"
UNITS = 3_000
WIDTH = 118


class Flaky(Exception):
    """A transient failure: the unit succeeds when tried again."""


def frame(progress: Progress, name: str) -> None:
    console = Console(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True)
    console.print(progress.get_renderable())
    (STATIC / name).write_text(console.export_svg(title="backfill"), encoding="utf-8")


async def main(url: str) -> None:
    engine = create_async_engine(url, pool_size=10, max_overflow=0)
    runner = SemaphoreRunner(
        async_sessionmaker(engine),
        limit="auto",
        errors="collect",
        retry=RetryPolicy(attempts=3, initial_delay=0.01, retry_on=lambda e: isinstance(e, Flaky)),
    )
    tried: set[int] = set()

    def unit(i: int):  # type: ignore[no-untyped-def]
        async def backfill(session: AsyncSession) -> int:
            await session.execute(text("SELECT pg_sleep(0.004)"))
            if i % 97 == 5 and i not in tried:
                tried.add(i)
                raise Flaky(i)
            if i % 751 == 400:
                raise ValueError(f"row {i} is malformed")
            return i

        return backfill

    console = Console(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True)
    progress = Progress(*default_columns(), console=console, auto_refresh=False)
    done = 0

    def on_outcome(outcome: Outcome[int]) -> None:
        nonlocal done
        done += 1
        if done == UNITS * 6 // 10:
            progress.refresh()
            frame(progress, "progress-running.svg")

    await runner.run([unit(i) for i in range(UNITS)], progress=progress, on_outcome=on_outcome)
    frame(progress, "progress-done.svg")
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "postgresql+asyncpg://postgres@127.0.0.1/test"))
