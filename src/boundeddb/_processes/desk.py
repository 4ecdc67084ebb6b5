"""
A ProcessRunner's journal lookups in flight: each asked of one worker, and asked again of another if
that one dies first. Every method runs under the fleet's lock.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from . import protocol as p

__all__ = ["LookupDesk"]


class Asked(Protocol):
    """What the desk needs of a worker's link: how busy it is, and a way to send to it."""

    handed: int

    def send(self, data: bytes) -> bool: ...


class _Lookup:
    __slots__ = ("future", "link", "message")

    def __init__(self, message: p.LookUp) -> None:
        self.message = message
        #: The keys that have a row, or the error the lookup raised.
        self.future: Future[set[str]] = Future()
        #: The worker asked, or None while no worker serves.
        self.link: Asked | None = None


class LookupDesk:
    """The lookups asked and not answered, and those waiting for a worker to ask."""

    def __init__(self, ready_links: Callable[[], list[Asked]]) -> None:
        self._ready_links = ready_links
        self._asked: dict[int, _Lookup] = {}
        self._unasked: list[_Lookup] = []
        self._ids = itertools.count(1)

    def open(self, kind: p.Kind, journal: tuple[str, str, bool], keys: list[str]) -> Future[set[str]]:
        """A lookup of ``keys`` in ``journal`` (job, table, create_table): asked now, or once one serves."""
        lookup = _Lookup(p.LookUp(next(self._ids), kind.value, journal, keys))
        self._asked[lookup.message.request] = lookup
        self._ask(lookup)
        return lookup.future

    def _ask(self, lookup: _Lookup) -> None:
        """Send ``lookup`` to the ready worker holding the fewest units, or keep it for the next."""
        links = self._ready_links()
        lookup.link = link = min(links, key=lambda ready: ready.handed) if links else None
        if link is None or not link.send(pickle.dumps(lookup.message)):
            lookup.link = None  # a link that cannot be sent to is dead: its reader will say so
            self._unasked.append(lookup)

    def answered(self, message: p.LookedUp) -> None:
        """A worker's answer."""
        lookup = self._asked.pop(message.request, None)
        if lookup is None:
            return
        if message.text:
            lookup.future.set_exception(p.load_error(message.error, message.text, -1))
        else:
            lookup.future.set_result(set(message.done))

    def ready(self) -> None:
        """A worker serves: ask it what no worker was there to answer."""
        unasked, self._unasked = self._unasked, []
        for lookup in unasked:
            self._ask(lookup)

    def lost(self, link: Asked) -> None:
        """``link``'s worker died: ask another what it had not answered (a lookup only reads)."""
        for lookup in [lookup for lookup in self._asked.values() if lookup.link is link]:
            self._ask(lookup)

    def fail(self, why: BaseException) -> None:
        """No worker will answer: every lookup waiting raises ``why``."""
        for lookup in self._asked.values():
            lookup.future.set_exception(why)
        self._asked.clear()
        self._unasked.clear()
