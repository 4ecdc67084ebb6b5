"""The auto limit's controller in memory: a fake latency model, a fake clock, no database."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from boundeddb._core.adaptive import PROBE_INTERVAL_S, LimitController
from boundeddb._core.attempts import Attempts
from boundeddb._core.limiter import Limiter
from boundeddb._core.pacing import SlidingWindow, drive
from boundeddb._core.recorder import NullRecorder
from boundeddb._core.run import ListSink, Run
from boundeddb._retry import NO_RETRY

from .test_core_pacing import FakeExecutor

Model = Callable[[int, random.Random], float]


def simulate(
    model: Model, *, low: int = 1, high: int = 20, initial: int = 4, windows: int = 400, seed: int = 1
) -> tuple[LimitController, list[int]]:
    """
    Feed the controller one window at a time: ``limit`` latencies from ``model(limit)``; the limit
    after each window that did not end in a probe (a probe's dip is by design).
    """
    rng = random.Random(seed)
    limiter = Limiter(initial)
    controller = LimitController(limiter, low=low, high=high, initial=initial)
    now, limits = 0.0, []
    for _ in range(windows):
        limit = limiter.limit
        latencies = [model(limit, rng) for _ in range(max(16, 2 * limit))]
        for latency in latencies:
            controller.observe(latency)
        now += max(latencies) * 2  # the window's duration, roughly
        controller.adjust(now)
        assert controller.low <= limiter.limit <= controller.high
        if not controller.probing:
            limits.append(limiter.limit)
    return controller, limits


def waiting(limit: int, rng: random.Random) -> float:
    """Units that mostly wait: latency does not grow with concurrency."""
    return 0.020 * rng.uniform(0.9, 1.1)


def saturating(knee: int, base: float = 0.002) -> Model:
    """Latency flat up to ``knee`` units in flight, then growing with them (a saturated resource)."""

    def model(limit: int, rng: random.Random) -> float:
        return base * max(1.0, limit / knee) * rng.uniform(0.9, 1.1)

    return model


def mixed(knee: int) -> Model:
    """Half fast reads, half writes five times slower, on a resource saturated beyond ``knee``."""

    def model(limit: int, rng: random.Random) -> float:
        base = 0.001 if rng.random() < 0.5 else 0.005
        return base * max(1.0, limit / knee) * rng.uniform(0.9, 1.1)

    return model


def test_the_limit_climbs_to_the_ceiling_while_latency_stays_flat() -> None:
    _, limits = simulate(waiting, high=20)
    assert limits[-1] == 20
    assert max(limits) == 20  # and never above it


def test_the_limit_settles_near_the_knee_when_latency_grows_with_concurrency() -> None:
    """Beyond the knee latency grows as limit / knee: the limit holds where it is 2-2.5x the base."""
    _, limits = simulate(saturating(knee=5), high=40)
    tail = limits[-100:]
    assert min(tail) >= 2 * 5 - 1, tail
    assert max(tail) <= 2.5 * 5 + 1, tail
    assert max(tail) - min(tail) <= 4  # a band, not a swing


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mixed_units_do_not_make_it_swing(seed: int) -> None:
    _, limits = simulate(mixed(knee=6), high=40, windows=600, seed=seed)
    tail = limits[-200:]
    assert min(tail) >= 6, sorted(set(tail))
    assert max(tail) <= 20, sorted(set(tail))
    changes = sum(1 for a, b in itertools.pairwise(tail) if a != b)
    assert changes < len(tail) // 2


def test_a_slower_database_is_not_mistaken_for_overload() -> None:
    """Everyone's latency doubles (not concurrency): after the next probe the limit is back up."""
    slow = {"factor": 1.0}

    def model(limit: int, rng: random.Random) -> float:
        return slow["factor"] * saturating(knee=8)(limit, rng)

    rng = random.Random(3)
    limiter = Limiter(4)
    controller = LimitController(limiter, low=1, high=40, initial=4)
    now = 0.0

    def windows(n: int) -> list[int]:
        nonlocal now
        seen = []
        for _ in range(n):
            limit = limiter.limit
            for _ in range(max(16, 2 * limit)):
                controller.observe(model(limit, rng))
            now += 0.05
            controller.adjust(now)
            seen.append(limiter.limit)
        return seen

    before = windows(300)[-50:]
    slow["factor"] = 2.0
    windows(int(PROBE_INTERVAL_S / 0.05) + 50)
    after = windows(100)[-50:]
    assert controller.base_s is not None
    assert controller.base_s > 0.003
    # (a probe may fall in either stretch: it drops the limit to 2 for one window)
    assert statistics.median(after) >= statistics.median(before) - 2, (before, after)


def test_overload_cuts_the_limit_by_a_quarter_and_never_below_the_floor() -> None:
    limiter = Limiter(20)
    controller = LimitController(
        limiter, low=3, high=20, initial=20, is_overload=lambda error: isinstance(error, TimeoutError)
    )
    controller._next_probe = float("inf")  # no probe in this test
    controller._base = 0.001
    limits = []
    for step in range(10):
        controller.failed(ValueError("not overload"))  # a unit's own error changes nothing
        controller.failed(TimeoutError())
        controller.adjust(float(step))
        limits.append(limiter.limit)
    assert limits[0] == 15
    assert limits == sorted(limits, reverse=True)
    assert limits[-1] == 3


def test_the_trace_records_each_change_and_stays_bounded() -> None:
    controller, _ = simulate(mixed(knee=6), high=40, windows=3000)
    points = controller.trace.since(0.0)
    assert len(points) <= 600
    assert points[-1][1] == controller._limiter.limit
    assert all(1 <= n <= 40 for _, n in points)


class ScriptedController(LimitController):
    """Moves the limit up and down at random on every tick: the pacing must follow, never over-grant."""

    def __init__(self, limiter: Limiter, rng: random.Random) -> None:
        super().__init__(limiter, low=1, high=12, initial=4)
        self._rng = rng

    def adjust(self, now: float | None = None) -> None:
        self._limiter.set_limit(self._rng.randint(1, 12))


@pytest.mark.anyio
async def test_a_moving_limit_never_over_grants_and_the_workers_follow_it() -> None:
    limiter = Limiter(4)
    controller = ScriptedController(limiter, random.Random(7))
    attempts = Attempts(NO_RETRY)
    seen: list[tuple[int, int]] = []
    peak = 0

    def unit_for(i: int) -> Any:
        async def unit(index: int) -> int:
            nonlocal peak
            seen.append((limiter.in_flight, limiter.limit))
            peak = max(peak, limiter.in_flight)
            await anyio.sleep(0.001 * (i % 5))
            seen.append((limiter.in_flight, limiter.limit))
            return index

        return unit

    sink = ListSink()
    run = Run([unit_for(i) for i in range(600)], sink, check=lambda u, i: None, stop_on_failure=True,
              recorder=NullRecorder(), observe=controller.observe)  # fmt: skip
    await drive(run, FakeExecutor(attempts), attempts, SlidingWindow(), limiter, 4, controller=controller)
    assert [o.value for o in sink.outcomes] == list(range(600))
    assert all(in_flight <= limit for in_flight, limit in seen)
    assert peak > 4  # the workers grew with the limit
    assert limiter.in_flight == 0
