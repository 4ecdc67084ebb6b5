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


def feed(limiter: Limiter, controller: LimitController, latencies: list[float], in_flight: int) -> None:
    """Report ``latencies`` as units that finished while ``in_flight`` units held slots."""
    held = [limiter.try_acquire() for _ in range(min(in_flight, limiter.limit))]
    for latency in latencies:
        controller.observe(latency)
    for _ in held:
        limiter.release()


def simulate(
    model: Model, *, low: int = 1, high: int = 20, initial: int = 4, windows: int = 400, seed: int = 1
) -> tuple[LimitController, list[int]]:
    """
    Feed the controller one window at a time: ``2 * limit`` (at least 32) latencies from
    ``model(limit)``, from units that fill the limit; the limit after each window that did not end
    in a probe (a probe's dip is by design).
    """
    rng = random.Random(seed)
    limiter = Limiter(initial)
    controller = LimitController(limiter, low=low, high=high, initial=initial)
    now, limits = 0.0, []
    for _ in range(windows):
        limit = limiter.limit
        latencies = [model(limit, rng) for _ in range(max(32, 2 * limit))]
        feed(limiter, controller, latencies, limit)
        now += max(0.125, max(latencies) * 2)  # the window's duration, roughly
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
            feed(limiter, controller, [model(limit, rng) for _ in range(max(32, 2 * limit))], limit)
            now += 0.125
            controller.adjust(now)
            seen.append(limiter.limit)
        return seen

    before = windows(300)[-50:]
    slow["factor"] = 2.0
    windows(int(PROBE_INTERVAL_S / 0.125) + 50)
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


# -- one behaviour at a time: a controller fed window by window on a fake clock ---------------------------


class Bench:
    """A controller whose windows are fed by hand: ``window(ratio)`` reports latencies of ratio x 1 ms."""

    BASE = 0.001

    def __init__(self, *, initial: int = 8, high: int = 40, low: int = 1) -> None:
        self.limiter = Limiter(initial)
        self.controller = LimitController(self.limiter, low=low, high=high, initial=initial)
        self.now = 0.0
        self.controller.adjust(self.now)  # the first look starts the first window
        self.window(1.0, in_flight=1)  # the base until the first probe (not filled: no climb yet)
        self.controller._next_probe = float("inf")  # no probe unless a test asks for one
        self.controller._rtt = None  # nor smoothing with that first window

    def window(
        self, ratio: float, *, count: int | None = None, in_flight: int | None = None, seconds: float = 0.125
    ) -> int:
        """One window's units (``2 * limit``, at least 32, filling the limit unless told); the limit after."""
        limit = self.limiter.limit
        n = max(32, 2 * limit) if count is None else count
        feed(
            self.limiter, self.controller, [ratio * self.BASE] * n, limit if in_flight is None else in_flight
        )
        self.now += seconds
        self.controller.adjust(self.now)
        return self.limiter.target


def test_the_limit_climbs_only_when_the_units_filled_it() -> None:
    """Flat latency, but never more than 3 units in flight at a limit of 8: the limit stays."""
    bench = Bench(initial=8)
    assert [bench.window(1.0, in_flight=3) for _ in range(20)] == [8] * 20
    assert bench.window(1.0) == 16  # filled: it climbs


def test_a_window_takes_32_latencies_and_a_tenth_of_a_second() -> None:
    """A window closes on at least 32 latencies and 0.1 s (or 1 s with a few)."""
    bench = Bench(initial=8)
    assert bench.window(1.0, count=31, seconds=0.5) == 8  # too few
    assert bench.window(1.0, count=1, seconds=0.0625) == 16  # 32 now, over 0.5625 s: closed
    assert bench.window(1.0, count=64, seconds=0.0625) == 16  # enough latencies, too soon
    assert bench.window(1.0, count=0, seconds=0.0625) == 32  # 0.125 s: closed


def test_slow_start_doubles_only_while_latency_stays_under_one_and_a_quarter_times_the_base() -> None:
    """Doubling at 1.2x the base; a tenth (at least 1) at 1.5x and 1.9x."""
    bench = Bench(initial=8)
    assert bench.window(1.2) == 16
    assert bench.window(1.5) == 17  # a tenth (at least 1)
    assert bench.window(1.9) == 18


def test_the_first_fall_goes_to_the_middle_of_the_band_but_at_most_halves() -> None:
    """The first fall aims at 2.25x the base latency, by Little's law, and cuts at most half."""
    bench = Bench(initial=16)
    assert bench.window(3.0) == 12  # 16 x 2.25 / 3: where latency should be 2.25x the base
    again = Bench(initial=16)
    assert again.window(10.0) == 8  # 16 x 2.25 / 10 = 3.6, but at most half


def test_after_a_fall_the_limit_climbs_by_one_and_falls_by_a_tenth() -> None:
    """Once fallen: additive increase (+1 a window), and later falls by a tenth."""
    bench = Bench(initial=16)
    assert bench.window(3.0) == 12
    assert [bench.window(1.0) for _ in range(4)] == [13, 14, 15, 16]
    bench.controller._throughput.clear()  # no throughput measured below: nothing holds the fall
    assert bench.window(3.0) == 15


def test_a_change_of_limit_starts_a_fresh_window_without_the_old_latency() -> None:
    """Right after a climb, one window at 3x the base makes it fall (smoothed with 1x, it would not)."""
    bench = Bench(initial=8)
    assert bench.window(1.0) == 16
    assert bench.window(3.0) < 16
    steady = Bench(initial=8)
    steady.controller._fallen = True  # climbs by 1
    steady.controller.high = 8  # at the ceiling: the limit stays, so windows are smoothed together
    assert steady.window(1.0) == 8
    assert steady.window(3.6) == 8  # smoothed with the window before at the same limit: 2.3x, in the band


def test_a_fall_that_would_cost_throughput_is_not_taken() -> None:
    """Latency 2.6x the base at 16 in flight: 6,150 units/s; a lower limit gave 5,000: it holds."""
    bench = Bench(initial=16)
    bench.controller._throughput = {8: (5_000.0, bench.now)}  # what limit 8 gave (Little's law)
    assert bench.window(2.6) == 16
    assert not bench.controller.probing
    bench.controller._throughput = {8: (7_000.0, bench.now)}  # had limit 8 given more, it falls
    assert bench.window(2.6) == 13  # 16 x 2.25 / 2.6


def test_a_faster_database_needs_two_windows_of_evidence_for_a_probe() -> None:
    """One window well below the base latency starts no probe; two in a row do."""
    bench = Bench(initial=8)
    bench.controller._fallen = True
    bench.window(0.5, in_flight=2)
    assert not bench.controller.probing
    bench.window(1.0, in_flight=2)
    bench.window(0.5, in_flight=2)
    assert not bench.controller.probing  # not in a row
    bench.window(0.5, in_flight=2)
    assert bench.controller.probing


def test_no_probe_runs_while_the_limit_is_at_its_ceiling() -> None:
    """Units that only wait: once at the ceiling, the limit never dips for a probe."""
    controller, _ = simulate(waiting, high=20, windows=600)  # 60 s of windows, six probe intervals
    points = controller.trace.since(0.0)
    at_ceiling = next(i for i, (_, n) in enumerate(points) if n == 20)
    assert all(n == 20 for _, n in points[at_ceiling:]), points


def test_the_first_probe_comes_a_second_into_the_run() -> None:
    """The base latency is first re-measured 1 s after the run's first look (not 2 s)."""
    limiter = Limiter(4)
    controller = LimitController(limiter, low=1, high=20, initial=4)
    controller.adjust(100.0)  # the run starts
    probed_at = None
    now = 100.0
    while probed_at is None and now < 110:
        feed(limiter, controller, [0.020] * 32, 1)  # not filled: the limit stays at 4
        now += 0.125
        controller.adjust(now)
        if controller.probing:
            probed_at = now
    assert probed_at is not None
    assert 101.0 <= probed_at < 101.25


def test_the_first_window_sets_the_base_and_the_climb_starts_with_it() -> None:
    """Units that fill the initial limit: the first window (the base) already doubles the limit."""
    limiter = Limiter(4)
    controller = LimitController(limiter, low=1, high=20, initial=4)
    controller.adjust(0.0)
    feed(limiter, controller, [0.020] * 32, 4)
    controller.adjust(0.125)
    assert controller.base_s == pytest.approx(0.020)
    assert limiter.limit == 8


def test_a_probe_that_finds_another_database_forgets_the_throughput_measured_before() -> None:
    """Base latency halved (a neighbour left): what limit 8 gave before no longer holds a fall back."""
    bench = Bench(initial=16)
    bench.controller._throughput = {8: (1_000.0, bench.now)}  # while the neighbour ran
    bench.controller._next_probe = bench.now  # a probe is due
    bench.window(1.0)  # starts it: the limit drops to 4 and drains
    assert bench.controller.probing
    bench.window(0.5, in_flight=4)  # drained: the probe's window follows
    bench.window(0.5, in_flight=4)  # the probe's latency: 0.5 ms, half the base before
    assert not bench.controller.probing
    assert bench.controller.base_s == pytest.approx(0.0005)
    assert set(bench.controller._throughput) == {4}
    assert bench.window(1.0, in_flight=8) == 16  # 2x: in the band
    assert bench.window(2.0) == 12  # smoothed, 3x: falls (limit 8 at 1,000 units/s would hold it)


def test_a_fall_is_weighed_only_against_limits_above_half_the_new_one() -> None:
    """Limit 2 gave less than 16 does now, but says nothing about 12: the fall is taken."""
    bench = Bench(initial=16)
    bench.controller._throughput = {2: (1_000.0, bench.now)}
    assert bench.window(3.0) == 12
