"""
:meth:`Attempts.retried` and ``retried_sync`` in memory: how a journal's lookup is retried by the
runner's policy, as a unit is. Under trio a mock clock jumps, so back-offs take no real time.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from trio.testing import MockClock

from boundeddb import RetryPolicy
from boundeddb._core.attempts import Attempts, ConnectFailed
from boundeddb._core.limiter import Limiter, Slot

pytestmark = [pytest.mark.anyio]


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    return "asyncio"


class Transient(Exception):
    """An error the policy retries."""


class Permanent(Exception):
    """An error the policy does not retry."""


def policy(attempts: int, delay: float = 0.01, **options: Any) -> RetryPolicy:
    return RetryPolicy(
        attempts=attempts,
        initial_delay=delay,
        jitter=False,
        retry_on=lambda error: isinstance(error, Transient),
        **options,
    )


class Failing:
    """An attempt that raises each of ``errors`` in turn, then returns ``"done"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        return self.sync()

    def sync(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def test_a_lookup_backing_off_gives_its_slot_back_and_takes_it_again() -> None:
    """During the back-off the slot is free for others; the next attempt runs within it again."""
    limiter = Limiter(1)
    slot = Slot(limiter)
    await slot.take()
    failing = Failing(Transient())
    held_by_attempt: list[bool] = []

    async def attempt() -> str:
        held_by_attempt.append(slot.held)
        return await failing()

    async with anyio.create_task_group() as tasks:

        async def look_up() -> None:
            assert await Attempts(policy(2)).retried(attempt, "a journal's lookup", slot) == "done"

        tasks.start_soon(look_up)
        while failing.calls == 0:  # the first attempt failed: the lookup sleeps from there on
            await anyio.lowlevel.checkpoint()
        in_flight_while_backing_off = limiter.statistics().in_flight
    assert in_flight_while_backing_off == 0
    assert held_by_attempt == [True, True]
    assert slot.held
    slot.give()


async def test_the_last_error_goes_through_unchanged_when_the_attempts_run_out() -> None:
    """Two transient errors and attempts=2: the second one, the very object, with its cause kept."""
    cause = OSError("the socket")
    last = Transient("second")
    last.__cause__ = cause
    failing = Failing(Transient("first"), last)
    told: list[tuple[str, int]] = []
    retries = policy(2, on_retry=lambda error, attempt, _delay: told.append((str(error), attempt)))
    with pytest.raises(Transient) as raised:
        await Attempts(retries).retried(failing, "a journal's lookup")
    assert raised.value is last
    assert raised.value.__cause__ is cause
    assert failing.calls == 2
    assert told == [("first", 1)], "on_retry told of the retry, not of the last failure"


async def test_an_error_the_policy_does_not_retry_goes_through_at_once() -> None:
    """A permanent error: one attempt, raised as it is."""
    error = Permanent()
    failing = Failing(error)
    with pytest.raises(Permanent) as raised:
        await Attempts(policy(5)).retried(failing, "a journal's lookup")
    assert raised.value is error
    assert failing.calls == 1


async def test_a_failed_connect_is_retried_whatever_the_error_and_raised_as_its_own() -> None:
    """As a unit's: a connection that could not be opened sent nothing, retried whatever its error."""
    refused = Permanent("refused")
    assert await Attempts(policy(2)).retried(Failing(ConnectFailed(Permanent())), "a lookup") == "done"
    failing = Failing(ConnectFailed(Permanent()), ConnectFailed(refused))
    with pytest.raises(Permanent) as raised:
        await Attempts(policy(2)).retried(failing, "a lookup")
    assert raised.value is refused, "the connect's own error, not its carrier"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_thread_s_back_off_ends_once_its_run_stopped() -> None:
    """retried_sync backs off (60 s) until stopped() says so, then raises the last error."""
    stop = threading.Event()
    error = Transient()
    failing = Failing(error, Transient())
    retries = policy(3, delay=60, on_retry=lambda *_: stop.set())
    with anyio.fail_after(20), pytest.raises(Transient) as raised:
        await anyio.to_thread.run_sync(Attempts(retries).retried_sync, failing.sync, "a lookup", stop.is_set)
    assert raised.value is error
    assert failing.calls == 1
