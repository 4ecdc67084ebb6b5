"""The progress bar of ``progress=True``, drawn with rich from the event loop, never from rich's threads."""

from __future__ import annotations

from datetime import timedelta

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)
from rich.text import Text

from ._core.feedback import Figures

__all__ = ["Progress", "RichDisplay"]


class RateColumn(ProgressColumn):
    """Units settled per second, as rich estimates it over the last 30 s."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-/s" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


class TimeColumn(ProgressColumn):
    """The time left as rich estimates it while the run lasts, then the time it took."""

    max_refresh = 0.5  # a steadier ETA

    def render(self, task: Task) -> Text:
        if task.finished:
            return Text(f"in {_clock(task.finished_time)}", style="progress.elapsed")
        left = task.time_remaining
        return Text(f"ETA {_clock(left)}", style="progress.remaining")


def _clock(seconds: float | None) -> str:
    return "-:--:--" if seconds is None else str(timedelta(seconds=int(seconds)))


class CountsColumn(ProgressColumn):
    """Failed and retried units, and units in flight against the limit, which moves with ``"auto"``."""

    def render(self, task: Task) -> Text:
        fields = task.fields
        failed = fields.get("failed", 0)
        text = Text()
        text.append(f"{failed:,} failed", style="red" if failed else "dim")
        text.append(f" · {fields.get('retried', 0):,} retried", style="dim")
        text.append(f" · {fields.get('in_flight', 0)}/{fields.get('limit', 0)} in flight")
        return text


def default_columns() -> tuple[ProgressColumn, ...]:
    """Description, bar, done/total, %, rate, ETA or the time taken, and the counts."""
    return (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        RateColumn(),
        TimeColumn(),
        CountsColumn(),
    )


class RichDisplay:
    """A task on a rich :class:`~rich.progress.Progress`, updated from the event loop."""

    def __init__(self, progress: Progress, description: str, total: int | None) -> None:
        self._progress = progress
        live = progress.live
        #: Started here, so stopped here; else the caller's, already showing.
        self._started_here = not live.is_started
        #: rich refreshes by itself only with auto_refresh; the runner's own bar never does.
        self._refresh = not live.auto_refresh
        self._task: TaskID = progress.add_task(
            description, total=total, failed=0, retried=0, in_flight=0, limit=0
        )
        if self._started_here:
            progress.start()

    @classmethod
    def on_stderr(cls, description: str, total: int | None) -> RichDisplay | None:
        """The runner's own bar on stderr, or None if stderr is neither a terminal nor a notebook."""
        console = Console(stderr=True)
        if not (console.is_terminal or console.is_jupyter):
            return None
        progress = Progress(*default_columns(), console=console, auto_refresh=False, transient=False)
        return cls(progress, description, total)

    def show(self, figures: Figures, *, final: bool) -> None:
        total = figures.total
        if final and total is None:
            total = figures.done  # the input's length is known now: show the bar full
        self._progress.update(
            self._task,
            completed=figures.done,
            total=total,
            failed=figures.failed,
            retried=figures.retried,
            in_flight=0 if final else figures.in_flight,
            limit=figures.limit,
        )
        if final:
            self._progress.stop_task(self._task)
        if self._refresh:
            self._progress.refresh()

    def close(self) -> None:
        if self._started_here:
            self._progress.stop()
