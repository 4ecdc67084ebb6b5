"""
The threads that end discarded connections (``_dialects/enders.py``), with an ``end`` of the test's:
a cancelled run's wait is bounded. The real side connections are tested in
``faults/test_discarded_backends.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence

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

    def __call__(self, key: Hashable, idents: Sequence[int]) -> None:
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
