"""
Threads that end discarded connections on the server, one per engine URL at a time.

A pool discards a connection in the middle of a statement (a timeout, a cancellation, a lost
socket), and the server may go on running that statement with its transaction open: MySQL until the
statement ends, PostgreSQL until it ends and the backend reads the closed socket, or for as long as
a half-open connection looks alive. A dialect hands each such connection's server identity to
:meth:`Enders.end_soon`, from the pool's ``invalidate`` event, which must never block: the caller
may be an event loop. A thread of :class:`Enders` then ends them from a side connection of its own,
all that were handed in meanwhile at once, and a cancelled run waits for it in
:meth:`Enders.wait`. While it waits for the server to let go of them, it takes in those handed in
since and ends them too: an ending that takes long (a server slow to end one) never makes another wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["END_WAIT_S", "Enders", "More"]

logger = logging.getLogger("boundeddb.dialects")

#: The most seconds a cancelled run waits for the connections it discarded to end on the server.
END_WAIT_S = 5.0

Ident = TypeVar("Ident")


#: What ``end`` is given to take in the identities handed in since it was called: those, or none.
More = Callable[[], list[Ident]]


class Enders(Generic[Ident]):
    """
    Ends discarded connections through ``end(key, idents, more)``, in a thread per key (an engine URL).

    ``end`` ends every connection of ``idents`` on the server that ``key`` names and returns once
    they are gone, or after a few seconds; it logs its own failures. While it waits, it calls
    ``more()`` for the identities handed in since, and ends those too.
    """

    def __init__(self, name: str, end: Callable[[Hashable, Sequence[Ident], More[Ident]], None]) -> None:
        self._name = name
        self._end = end
        self._lock = threading.Lock()
        #: Per key: the identities handed in and not yet taken by its thread.
        self._queued: dict[Hashable, list[Ident]] = {}
        #: Per key: its thread, from when it is started until it has nothing left to end.
        self._threads: dict[Hashable, threading.Thread] = {}

    def end_soon(self, key: Hashable, ident: Ident) -> None:
        """End connection ``ident`` on ``key``'s server soon, from the key's thread. Never blocks."""
        with self._lock:  # queued before it starts: a cancelled run that looks next must find it
            self._queued.setdefault(key, []).append(ident)
            if key in self._threads:
                return
            thread = threading.Thread(target=self._drain, args=(key,), name=self._name, daemon=True)
            self._threads[key] = thread
        try:
            thread.start()
        except BaseException:
            with self._lock:
                self._queued.pop(key, None)
                self._threads.pop(key, None)
            raise

    def _drain(self, key: Hashable) -> None:
        while True:
            with self._lock:
                idents = self._queued.pop(key, None)
                if not idents:
                    del self._threads[key]
                    return
            try:
                self._end(key, idents, lambda: self._more(key))
            except Exception:  # never let the thread die with identities still queued
                logger.exception("%s: ending discarded connections failed", self._name)

    def _more(self, key: Hashable) -> list[Ident]:
        """The identities handed in for ``key`` since its thread last took them (its ``end``'s ``more``)."""
        with self._lock:
            return self._queued.pop(key, [])

    def ending(self, key: Hashable) -> bool:
        """Whether connections discarded on ``key`` are still being ended."""
        with self._lock:
            return key in self._threads

    def wait(self, key: Hashable, timeout: float = END_WAIT_S) -> None:
        """Block until :meth:`ending` is over for ``key``, for at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                thread = self._threads.get(key)
            remaining = deadline - time.monotonic()
            if thread is None or remaining <= 0:
                return
            if thread.ident is not None:  # started; end_soon() starts it right after registering it
                thread.join(remaining)
            else:
                time.sleep(0.001)
