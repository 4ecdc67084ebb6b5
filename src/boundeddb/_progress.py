"""
How a call's ``progress=`` and ``on_outcome=`` are checked and turned into what serves them.

rich is an optional dependency, ``boundeddb[progress]``. It is imported only when a call asks for
a progress bar, so a runner costs nothing more without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Any, NoReturn

from ._core.feedback import Display, Feedback
from ._core.limiter import Limiter
from ._core.recorder import NullRecorder
from ._core.run import Run
from ._outcome import Outcome

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = [
    "FeedbackRequest",
    "both_hooks",
    "check_on_outcome",
    "feedback_request",
    "open_display",
    "open_feedback",
    "runner_hook",
]

logger = logging.getLogger("boundeddb.hooks")

_MISSING_RICH = (
    "progress=True draws its bar with rich, an optional dependency: install it with "
    "`pip install 'boundeddb[progress]'` (or `pip install rich`), or leave progress off"
)


def runner_hook(hook: Callable[[Outcome[Any]], object] | None) -> Callable[[Outcome[Any]], None] | None:
    """A runner's ``on_outcome``: what it raises is logged and ignored, so a metrics bug fails no unit."""
    if hook is None:
        return None

    def call(outcome: Outcome[Any]) -> None:
        try:
            hook(outcome)
        except Exception:
            logger.warning("the runner's on_outcome raised at unit %d: ignored", outcome.index, exc_info=True)

    return call


def both_hooks(
    runner: Callable[[Outcome[Any]], None] | None, call: Callable[[Outcome[Any]], object] | None
) -> Callable[[Outcome[Any]], object] | None:
    """The runner's ``on_outcome``, then the call's: one hook for the run, or None if neither."""
    if runner is None:
        return call
    if call is None:
        return runner

    def both(outcome: Outcome[Any]) -> object:
        runner(outcome)
        return call(outcome)

    return both


def check_on_outcome(on_outcome: object) -> Callable[[Any], object] | None:
    """``on_outcome`` if it is None or callable, else a :class:`TypeError` that names the fix."""
    if on_outcome is None or callable(on_outcome):
        return on_outcome
    msg = (
        f"on_outcome must be a function that takes an Outcome (or None), got {on_outcome!r} "
        f"({type(on_outcome).__name__}): pass e.g. on_outcome=lambda outcome: log.info(outcome)"
    )
    raise TypeError(msg)


def open_display(progress: object, description: str, total: float) -> Display | None:
    """
    The display ``progress`` asks for, started, or None for none.

    ``True``: a bar of the runner's own on stderr, labelled ``description``, only when stderr is a
    terminal or a notebook. A string: the same bar with that label.
    A :class:`rich.progress.Progress`: a task on it. The progress is started for the run if it was not.

    Raises:
        ImportError: if a bar is asked for and rich is not installed, even when stderr is not a
            terminal, so that a program that works in CI works in a terminal too.
        TypeError: if ``progress`` is neither a bool nor a rich ``Progress``.
    """
    if progress is False:
        return None
    try:
        from ._rich_display import Progress as RichProgress
        from ._rich_display import RichDisplay
    except ImportError as error:
        if progress is True or isinstance(progress, str):
            raise ImportError(_MISSING_RICH) from error
        return _not_a_progress(progress)  # without rich, no Progress can have been passed
    known = None if total == float("inf") else int(total)
    if progress is True or isinstance(progress, str):
        label = progress if isinstance(progress, str) else description
        return RichDisplay.on_stderr(label, known)
    if isinstance(progress, RichProgress):
        return RichDisplay(progress, description, known)
    return _not_a_progress(progress)


def _not_a_progress(progress: object) -> NoReturn:
    msg = (
        f"progress must be True, False, a label (str) or a rich.progress.Progress, got {progress!r} "
        f"({type(progress).__name__}): pass progress=True for a bar on stderr"
    )
    raise TypeError(msg)


class FeedbackRequest:
    """
    What a call asked to see of its run: ``progress`` and ``on_outcome`` checked, for a ``Feedback`` to serve.

    ``size`` is the input's length where the units are made from it, as in ``map(fn, items)``.
    """

    __slots__ = ("asked", "description", "on_outcome", "progress", "size")

    def __init__(
        self,
        progress: bool | str | Progress,
        on_outcome: object,
        *,
        description: str = "",
        items: object = None,
    ) -> None:
        self.progress = progress
        self.on_outcome: Callable[[Outcome[Any]], object] | None = check_on_outcome(on_outcome)
        self.asked = progress is not False or self.on_outcome is not None
        self.description = description
        self.size: float | None = len(items) if isinstance(items, Sized) else None


def feedback_request(
    progress: bool | str | Progress, on_outcome: object, description: str, items: object = None
) -> FeedbackRequest | None:
    """What a call asked to see of its run, checked, or None in the common case of nothing to serve."""
    if progress is False and on_outcome is None:
        return None
    return FeedbackRequest(progress, on_outcome, description=description, items=items)


def open_feedback(
    run: Run[Any], recorder: NullRecorder, limiter: Limiter, request: FeedbackRequest | None, runner: str
) -> Feedback | None:
    """What serves ``request`` and the runner's hook beside ``run``'s workers, or None if nothing is asked."""
    if request is None or not request.asked:
        # The runner's on_outcome alone, served beside the workers. Threads queue their outcomes.
        return None if run.hook is None else Feedback(run.hook, None, recorder, limiter, run.size)
    display = open_display(request.progress, request.description or runner, run.size)
    if display is None and run.hook is None:
        return None  # a bar on a stderr that is not a terminal: nothing to serve
    return Feedback(run.hook, display, recorder, limiter, run.size)
