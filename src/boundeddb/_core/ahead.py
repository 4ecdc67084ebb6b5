"""An async input read ahead by a task of its own, so that a batch can wait for more with a deadline."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import anyio

__all__ = ["END_OF_INPUT", "ReadAhead"]

#: What ``anext()`` returns at the end of the input: a unit may be any object, None included.
END_OF_INPUT: Any = object()


class ReadAhead:
    """An async input pulled by a task of its own into a buffer, for :meth:`Run.pull_before`."""

    def __init__(self, iterator: AsyncIterator[Any], capacity: int) -> None:
        self._iterator = iterator
        self._capacity = capacity
        self._units: deque[Any] = deque()
        self._ended = False
        self._error: Exception | None = None
        self._arrived = anyio.Event()
        self._taken = anyio.Event()

    async def fill(self) -> None:
        """Pull the input until it ends, keeping at most ``capacity`` units not yet taken."""
        try:
            while True:
                while len(self._units) >= self._capacity:
                    if self._taken.is_set():
                        self._taken = anyio.Event()
                    await self._taken.wait()
                try:
                    unit = await anext(self._iterator, END_OF_INPUT)
                except Exception as error:  # the caller's input failed: the taker re-raises it
                    self._error = error
                    return
                if unit is END_OF_INPUT:
                    return
                self._units.append(unit)
                self._arrived.set()
        finally:
            self._ended = True
            self._arrived.set()

    @property
    def ready(self) -> bool:
        """Whether a unit pulled ahead waits to be taken."""
        return bool(self._units)

    def take_nowait(self) -> Any:
        """The next unit pulled ahead. Call it only when :attr:`ready`."""
        unit = self._units.popleft()
        self._taken.set()
        return unit

    async def take(self) -> Any:
        """The next unit or ``END_OF_INPUT``, or the input's own error raised. Cancelling it loses nothing."""
        while not self._units:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return END_OF_INPUT
            if self._arrived.is_set():
                self._arrived = anyio.Event()
            await self._arrived.wait()
        return self.take_nowait()
