"""
The threads that end discarded connections (``_dialects/enders.py``), with an ``end`` of the test's:
a cancelled run's wait is bounded, and an ``end`` that waits takes in what is handed in meanwhile. The
real side connections are tested in ``faults/test_discarded_backends.py`` and ``stacks/test_mysql.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence

from boundeddb._dialects.enders import Enders

WAIT_S = 5.0
#: How long a held ``end`` waits to be let go: longer than any wait of the tests.
HOLD_S = 60.0


class Spy:
    """An ``end`` that blocks while ``hold`` is clear, and tells what it ended and how many ran at once."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.ended: list[int] = []
        self.started = threading.Semaphore(0)
        self.done = threading.Condition(self.lock)

    def __call__(self, key: Hashable, idents: Sequence[int], more: Callable[[], list[int]]) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.started.release()
        self.hold.wait(HOLD_S)
        with self.lock:
            self.running -= 1
            self.ended.extend(idents)
            self.done.notify_all()

    def wait_ended(self, count: int) -> bool:
        with self.lock:
            return self.done.wait_for(lambda: len(self.ended) >= count, WAIT_S)


def test_the_wait_of_a_cancelled_run_is_bounded() -> None:
    """wait() gives up at its timeout while a thread is stuck, and ending() still says so."""
    spy = Spy()
    enders: Enders[int] = Enders("test-end", spy)
    enders.end_soon("url", 1)
    assert spy.started.acquire(timeout=WAIT_S)
    enders.wait("url", timeout=0.05)
    assert enders.ending("url")
    spy.hold.set()
    enders.wait("url")
    assert not enders.ending("url")
    assert spy.ended == [1]


def test_connections_handed_in_while_an_end_waits_are_taken_in_by_it() -> None:
    """A slow ending never makes a later one wait for it: the running ``end`` takes the later ones in."""
    taken: list[int] = []
    began, release = threading.Event(), threading.Event()
    calls: list[Sequence[int]] = []

    def end(key: Hashable, idents: Sequence[int], more: Callable[[], list[int]]) -> None:
        calls.append(idents)
        taken.extend(idents)
        began.set()
        while not release.wait(0.001):  # the server has not let go of ``idents`` yet
            taken.extend(more())

    enders: Enders[int] = Enders("test-end", end)
    enders.end_soon("url", 1)
    assert began.wait(WAIT_S)
    enders.end_soon("url", 2)
    enders.end_soon("url", 3)
    deadline = time.monotonic() + WAIT_S
    while taken != [1, 2, 3] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert taken == [1, 2, 3], "taken in while the first still waited"
    release.set()
    enders.wait("url")
    assert not enders.ending("url")
    assert calls == [[1]], "one call: nothing was left for a second"
