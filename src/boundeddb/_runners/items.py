"""
How a call's units are checked before any database work.

It also makes the units of ``map(fn, items)``, each ``fn(session, item)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

from .._arguments import checked_iterable
from .._core.run import UnitCheck
from .._errors import UnitMisuseError

__all__ = ["BoundItem", "check_now", "check_when_pulled", "checked_units", "units_of"]


def checked_units(units: object, check: UnitCheck) -> Iterable[Any] | AsyncIterable[Any]:
    """``units`` if iterable. A list or tuple is checked whole, before any database work."""
    checked = checked_iterable(units, "units")
    if isinstance(checked, (list, tuple)):
        for index, unit in enumerate(checked):
            check_now(unit, index, check)
    return checked


def check_when_pulled(units: object, check: UnitCheck) -> UnitCheck | None:
    """
    What a run checks each unit with as it pulls it: nothing for a list or tuple, which every caller
    checked whole before the run (run() and stream() with :func:`checked_units`, submit() its one
    unit with :func:`check_now`), else ``check``.
    """
    return None if isinstance(units, (list, tuple)) else check


def check_now(unit: object, index: int, check: UnitCheck) -> None:
    """Raise :class:`~boundeddb.UnitMisuseError` if ``check`` finds ``unit`` wrong."""
    message = check(unit, index)
    if message is not None:
        raise UnitMisuseError(message)


def units_of(fn: object, items: object, runner: str) -> Iterable[Any] | AsyncIterable[Any]:
    """Turn ``map(fn, items)`` into lazy units ``fn(session, item)``."""
    if not callable(fn):
        msg = f"fn must be callable as fn(session, item), got {fn!r}: pass the function to {runner}.map()"
        raise TypeError(msg)
    if isinstance(items, AsyncIterable):

        async def bind_async() -> AsyncIterator[Callable[[Any], Any]]:
            async for item in items:
                yield BoundItem(fn, item)

        return bind_async()
    if isinstance(items, Iterable) and not isinstance(items, (str, bytes)):
        return (BoundItem(fn, item) for item in items)
    msg = (
        f"items must be an iterable or async iterable, got {type(items).__name__}: "
        f"pass e.g. a list or a generator of the items to give fn, as {runner}.map(fn, items)"
    )
    raise TypeError(msg)


class BoundItem:
    """``fn(session, item)`` as a unit that keeps ``fn``'s kind visible to unit checks."""

    __slots__ = ("fn", "item")

    def __init__(self, fn: Callable[..., Any], item: Any) -> None:
        self.fn = fn
        self.item = item

    def __call__(self, session: Any) -> Any:
        return self.fn(session, self.item)
