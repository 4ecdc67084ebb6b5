"""The auto limit's controller in memory: throughput models, a fake clock, no database."""

from __future__ import annotations

import itertools
import math
import random
import statistics
import sys
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from boundeddb._core import adaptive, windows
from boundeddb._core.adaptive import LimitController
from boundeddb._core.attempts import Attempts
from boundeddb._core.climb import Climb
from boundeddb._core.limiter import Limiter
from boundeddb._core.pacing import SlidingWindow, drive
from boundeddb._core.recorder import NullRecorder
from boundeddb._core.run import Run
from boundeddb._core.sinks import ListSink
from boundeddb._retry import NO_RETRY
from tests.support.fakes import FakeExecutor

#: Units per second that ``limit`` units in flight give (the database and client as one curve).
Curve = Callable[[int], float]


def feed(limiter: Limiter, controller: LimitController, latencies: list[float], in_flight: int) -> None:
    """Report ``latencies`` as units that finished while ``in_flight`` units held slots."""
    held = [limiter.try_acquire() for _ in range(min(in_flight, limiter.limit))]
    for latency in latencies:
        controller.observe(latency)
    for _ in held:
        limiter.release()


class System:
    """
    A controller fed by a throughput curve on a fake clock: at limit L the units (filling it) take
    ``L / curve(L)`` seconds each, times a noise factor; a window's units take as long as Little's
    law says they do.
    """

    def __init__(
        self,
        curve: Curve,
        *,
        initial: int = 4,
        high: int = 20,
        low: int = 1,
        noise: float = 0.0,
        seed: int = 1,
        mix: Callable[[random.Random], float] | None = None,
    ) -> None:
        self.curve = curve
        self.noise = noise
        self.mix = mix
        self.rng = random.Random(seed)
        self.limiter = Limiter(initial)
        self.controller = LimitController(self.limiter, low=low, high=high, initial=initial)
        self.now = 0.0
        self.controller.adjust(self.now)  # the first look starts the first window

    def latency(self, limit: int) -> float:
        """A unit's latency: Little's law's, off by the noise, times the mix's draw (mean 1)."""
        factor = math.exp(self.rng.gauss(0.0, self.noise)) if self.noise else 1.0
        if self.mix is not None:
            factor *= self.mix(self.rng)
        return limit / self.curve(limit) * factor

    def step(self, *, in_flight: int | None = None) -> int:
        """
        Units at the limit, a round at a time (as many as are in flight, taking their latency), the
        controller looking after each round, until a window closes; the limit after it.
        """
        closed = self.controller.windows.closed
        while self.controller.windows.closed == closed:
            limit = self.limiter.limit
            latencies = [self.latency(limit) for _ in range(limit)]
            feed(self.limiter, self.controller, latencies, limit if in_flight is None else in_flight)
            self.now += sum(latencies) / limit
            self.controller.adjust(self.now)
        return self.limiter.target

    def run(self, steps: int) -> list[int]:
        """The limit after each of ``steps`` rounds of units."""
        limits = []
        for _ in range(steps):
            limits.append(self.step())
            assert self.controller.low <= self.limiter.limit <= self.controller.high
        return limits

    def home(self) -> int:
        """Where the cruise holds the limit (looks aside)."""
        return self.controller._home


def waiting(limit: int) -> float:
    """Units that only wait (20 ms each): throughput grows with the limit."""
    return limit / 0.020


def saturating(knee: int, base: float = 0.002) -> Curve:
    """Throughput grows with the limit up to ``knee``, then stays flat (a saturated resource)."""
    return lambda limit: min(limit, knee) / base


def peaked(peak: int, base: float = 0.002) -> Curve:
    """Throughput grows up to ``peak`` and falls beyond it (contention: threads and a lock, say)."""
    return lambda limit: min(limit, peak) / base * min(1.0, (peak / limit) ** 0.5)


def shared_cores(cores: int, others: int, base: float = 0.002) -> Curve:
    """
    Units that keep a server core busy, on ``cores`` cores that ``others`` busy processes also want:
    the scheduler shares the cores equally among everything runnable, so L units in flight get
    ``cores * L / (L + others)`` of them (each at most one): more units win more of the machine.
    """
    return lambda limit: min(limit, cores * limit / (limit + others)) / base


# -- where the limit goes ---------------------------------------------------------------------------


def test_units_that_only_wait_take_the_limit_to_the_ceiling_by_doubling_and_never_past_it() -> None:
    system = System(waiting, initial=4, high=20)
    limits = system.run(40)
    assert limits[:2] == [8, 20]  # a doubling, then (it paid in full) four times, capped
    assert max(limits) == 20
    assert system.home() == 20  # and it stays (looks down to 15 aside)
    assert statistics.mean(limits) > 18


@pytest.mark.parametrize(
    ("curve", "climb"),
    [(waiting, [8, 32, 128, 200]), (saturating(12), [8, 32, 16])],
    ids=["waiting", "saturating at 12"],
)
def test_the_climb_leaps_only_while_doublings_pay_in_full(curve: Curve, climb: list[int]) -> None:
    """Four times the limit after a full-paying doubling; the skipped doubling if a leap did not pay."""
    system = System(curve, initial=4, high=200)
    limits = system.run(len(climb))
    assert limits == climb


@pytest.mark.parametrize("knee", [3, 6, 10])
def test_on_a_saturated_resource_the_limit_settles_at_the_knee(knee: int) -> None:
    """Past the knee more units only queue: the fewest that give the most throughput, or one more."""
    system = System(saturating(knee), initial=4, high=40)
    system.run(300)
    assert knee <= system.home() <= knee + 1


@pytest.mark.parametrize("peak", [2, 3, 5])
def test_when_more_units_cost_throughput_the_limit_goes_back_to_the_peak(peak: int) -> None:
    """A curve that falls beyond its peak (threads fighting over one core): the limit finds the peak."""
    system = System(peaked(peak), initial=4, high=40)
    system.run(300)
    assert system.home() in (peak, peak + 1)  # within the tolerance, the fewer
    assert peaked(peak)(system.home()) >= 0.95 * peaked(peak)(peak)


def assert_settles_near(system: System, low: int, high: int, *, moves: int = 12) -> None:
    """After 100 windows, the home limit stays in ``[low, high]``, moving at most ``moves`` times in 300."""
    system.run(100)
    homes = []
    for _ in range(300):
        system.step()
        homes.append(system.home())
    assert min(homes) >= low, sorted(set(homes))
    assert max(homes) <= high, sorted(set(homes))
    assert sum(1 for a, b in itertools.pairwise(homes) if a != b) <= moves


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_noisy_windows_keep_it_near_the_knee_without_swinging(seed: int) -> None:
    """Each window's latency off by 10% at random: the cruise moves on evidence only."""
    assert_settles_near(System(saturating(6), initial=4, high=40, noise=0.1, seed=seed), 5, 9)


#: The controller climbs a flat curve on some draws of mixed latencies: seed 8 takes the limit to
#: 21-40 (the knee is 6) on every Python, and seed 1 to 22 on 3.12 and later, whose sum() of floats
#: rounds differently (compensated summation) and so decides one comparison the other way. A known
#: fault of the controller (found running the tests on every claimed Python, #28), kept visible:
#: strict, so a fix shows as an unexpected pass.
DRIFTS = "the cruise's looks up drift on a flat curve with mixed latencies (a known fault, #28)"


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(1, marks=pytest.mark.xfail(sys.version_info >= (3, 12), reason=DRIFTS, strict=True)),
        2,
        3,
        4,
        pytest.param(8, marks=pytest.mark.xfail(reason=DRIFTS, strict=True)),
    ],
)
def test_mixed_units_do_not_make_it_swing(seed: int) -> None:
    """
    Half fast reads, half writes five times slower, saturating past 6 (a window's throughput is off
    by 15-20%): the limit stays where throughput is flat, below 3x the knee, and barely moves.
    """
    mix = lambda rng: 1 / 3 if rng.random() < 0.5 else 5 / 3  # noqa: E731
    assert_settles_near(System(saturating(6), initial=4, high=40, seed=seed, mix=mix), 6, 17)


def test_a_slower_database_is_not_mistaken_for_overload() -> None:
    """Everyone's latency doubles (not concurrency): throughput halves at every limit, the limit stays."""
    slow = {"factor": 1.0}
    system = System(lambda limit: saturating(6)(limit) / slow["factor"], initial=4, high=40)
    system.run(200)
    before = system.home()
    slow["factor"] = 2.0
    system.run(200)
    assert before == system.home() == 6


@pytest.mark.parametrize(("others", "low", "high"), [(0, 2, 3), (2, 8, 12), (8, 20, 24)])
def test_beside_busy_processes_the_limit_rises_only_as_far_as_more_units_win_more_of_the_cores(
    others: int, low: int, high: int
) -> None:
    """
    Server-bound units on 2 cores: alone, the knee is at 2; beside busy processes more units in flight
    really do get more of the cores (what tests/test_auto_limit.py's real-server test met on a busy
    machine, where it ended at 16 of a pool of 24), so the limit goes higher, and every rise of the
    limit it holds is a gain of more than GAIN: no drift.
    """
    curve = shared_cores(2, others)
    system = System(curve, initial=4, high=24)
    homes = []
    for _ in range(250):
        system.step()
        homes.append(system.home())
    assert low <= system.home() <= high, sorted(set(homes))
    rises = [(a, b) for a, b in itertools.pairwise(homes) if b > a]
    assert all(curve(b) > (1 + adaptive.GAIN) * curve(a) for a, b in rises), rises


def test_a_neighbour_that_moves_the_knee_is_followed_down_and_back_up() -> None:
    """The knee moves from 8 to 3 (another workload takes the server) and back: the limit follows."""
    curve = {"now": saturating(8)}
    system = System(lambda limit: curve["now"](limit), initial=4, high=40)
    system.run(200)
    assert 8 <= system.home() <= 9
    curve["now"] = saturating(3, base=0.004)
    system.run(200)
    assert system.home() == 3
    curve["now"] = saturating(8)
    after = system.run(200)
    assert 8 <= system.home() <= 9
    assert max(after[:8]) >= 8  # the change is seen at once and the climb starts again


def test_after_a_change_the_climb_waits_for_throughput_to_settle() -> None:
    """
    A neighbour leaves over four windows (throughput at every limit ramps up 4x): a climb that
    started at once would take the ramp for the limit's doing and double to the ceiling.
    """
    factor = {"now": 1.0}
    system = System(lambda limit: saturating(4)(limit) * factor["now"], initial=4, high=40)
    system.run(150)
    assert system.home() == 4
    factor["now"] = 0.25
    system.run(150)
    assert system.home() == 4
    limits = []
    for ramp in (0.4, 0.6, 0.8, 1.0):
        factor["now"] = ramp
        limits.append(system.step())
    limits += system.run(30)
    assert max(limits) <= 8, limits
    assert system.home() == 4


def test_the_limit_climbs_only_when_the_units_fill_it() -> None:
    """Units that never hold more than 3 slots at a limit of 8 say nothing about limits: it stays."""
    system = System(waiting, initial=8, high=40)
    assert [system.step(in_flight=3) for _ in range(20)] == [8] * 20
    assert system.step() == 16  # filled: the climb's first window doubles it


@pytest.mark.parametrize(
    ("throughputs", "path", "home"),
    [
        # 8 gives 1.2x (not the 4/3 a doubling must pay): 2 is measured too, and 8 is the best
        ({1: 500, 2: 800, 4: 1000, 8: 1200, 16: 1200}, [8, 2, 8], 8),
        # 8 costs throughput: halving, and again while it costs at most TOLERANCE; the fewer within 1%
        ({1: 700, 2: 995, 4: 1000, 8: 900}, [8, 2, 1, 2], 2),
        # 2 costs more than TOLERANCE: back to 4
        ({1: 500, 2: 900, 4: 1000, 8: 1010}, [8, 2, 4], 4),
        # doubling pays twice, then not: the best of what it measured
        ({4: 400, 8: 600, 16: 900, 32: 950, 40: 950}, [8, 16, 32, 32], 32),
        ({4: 400, 8: 600, 16: 900, 32: 905, 40: 905}, [8, 16, 32, 16], 16),
        # the first doubling pays in full: a leap to 32, which does not pay, then the 16 it skipped
        ({4: 400, 8: 800, 16: 1200, 32: 1250, 40: 1250}, [8, 32, 16, 32], 32),
        ({4: 400, 8: 800, 16: 1200, 32: 1205, 40: 1205}, [8, 32, 16, 16], 16),
    ],
)
def test_the_climb_doubles_while_it_pays_then_halves_then_takes_the_best_it_measured(
    throughputs: dict[int, float], path: list[int], home: int
) -> None:
    system = System(lambda limit: throughputs[limit], initial=4, high=40)
    assert [system.step() for _ in path] == path
    assert system.controller.phase == "cruise"
    assert system.home() == home


def test_a_climb_from_the_ceiling_halves() -> None:
    """Nowhere up to go: the climb looks down instead."""
    system = System(peaked(3), initial=12, high=12)
    assert [system.step() for _ in range(3)] == [6, 3, 1]
    system.step()
    assert system.home() == 3


def test_a_climb_that_a_look_started_never_halves_below_its_start() -> None:
    """Started above a limit the cruise measured: if doubling does not pay, it ends where it started."""
    climb = Climb(6, halves=False)
    assert climb.step(6, 600.0, low=1, high=40, may_rise=True) == (12, "climbing: doubling")
    assert climb.step(12, 603.0, low=1, high=40, may_rise=True) is None
    assert climb.pick() == 6  # the fewer within PICK_TOLERANCE
    fresh = Climb(6)
    fresh.step(6, 600.0, low=1, high=40, may_rise=True)
    assert fresh.step(12, 603.0, low=1, high=40, may_rise=True) == (3, "climbing: halving")


def test_the_climbs_curve_gives_a_neighbours_ratio_measured_or_between_two_measured_limits() -> None:
    """Measured where it stood; log-log between the limits around a neighbour; nothing beyond its ends."""
    climb = Climb(4)
    for limit, throughput in ((4, 400.0), (8, 700.0), (2, 210.0)):
        climb.points[limit] = throughput
    assert climb.ratio(4, 2) == pytest.approx(210 / 400)
    assert climb.ratio(4, 6) == pytest.approx(
        math.exp(math.log(400) + math.log(1.5) / math.log(2) * math.log(700 / 400)) / 400
    )
    assert climb.ratio(4, 3) is not None
    assert climb.ratio(4, 12) is None  # above everything measured
    assert climb.ratio(5, 6) is None  # the home was not measured


def first_look_after_the_climb(system: System, windows_: int = 40) -> tuple[int, int]:
    """(windows from first reaching the home the climb ends at to the cruise's first look, its limit)."""
    limits = system.run(windows_)
    home = system.home()
    reached = limits.index(home)
    look = next(i for i in range(reached + 1, len(limits)) if limits[i] != home)
    return look - reached, limits[look]


def test_a_side_the_climb_shows_not_to_pay_is_first_looked_at_later() -> None:
    """
    At the ceiling with units that only wait, the climb measured 8 and 20: a quarter below gives
    about 0.8 of 20 on that curve, so the first look down waits SEEDED_WAIT windows, not one.
    On a saturated resource the climb's curve is flat next to the knee: the first look comes at once.
    """
    waited, where = first_look_after_the_climb(System(waiting, initial=4, high=20))
    assert where == 15
    assert waited >= adaptive.SEEDED_WAIT
    waited, _ = first_look_after_the_climb(System(saturating(5), initial=4, high=40))
    assert waited <= adaptive.FIRST_WAIT_UP


def test_a_look_up_that_pays_like_a_doubling_climbs_again() -> None:
    """
    Units that only wait, and a cruise at 5 (a climb misled by a stall): after a look down, the look
    up at 6 pays like a doubling, so it climbs from 6 (12, then 40) instead of creeping up a step at
    a time, and never back below 6.
    """
    system = System(waiting, initial=4, high=40)
    system.run(1)
    system.controller._cruise(5, "a climb misled by a stall of the machine")
    limits = system.run(12)
    assert limits[:7] == [4, 5, 6, 5, 6, 12, 40]
    assert min(limits[4:]) >= 6
    assert system.home() == 40


# -- windows --------------------------------------------------------------------------------------


def test_the_first_latencies_warm_up_and_are_left_out() -> None:
    """The first WARM_UP latencies per slot (connections opening, statements prepared) belong to no window."""
    limiter = Limiter(4)
    controller = LimitController(limiter, low=1, high=40, initial=4)
    controller.adjust(0.0)
    feed(limiter, controller, [1.0] * windows.WARM_UP * 4, 4)  # very slow, and left out
    controller.adjust(0.05)
    feed(limiter, controller, [0.004] * 16, 4)  # the climb's first window: 1,000 units/s
    controller.adjust(0.2)
    assert limiter.target == 8
    assert controller._climbing.points == {4: pytest.approx(1000.0)}


def test_a_window_takes_32_latencies_and_a_tenth_of_a_second() -> None:
    """A cruise window closes on 32 latencies (twice the limit if more) and 0.1 s, or on 1 s with a few."""
    system = System(saturating(4), initial=4, high=4, low=4)  # nowhere to climb: a cruise
    system.run(3)
    assert system.controller.phase == "cruise"
    assert system.controller.windows.skip == 0
    controller, limiter = system.controller, system.limiter
    closed, now = controller.windows.closed, system.now

    def after(count: int, seconds: float) -> int:
        nonlocal now
        feed(limiter, controller, [0.001] * count, 4)
        now += seconds
        controller.adjust(now)
        return controller.windows.closed - closed

    assert after(31, 0.6) == 0  # 31 latencies over 0.6 s: not yet
    assert after(1, 0.0) == 1  # 32
    assert after(64, 0.05) == 1  # 64 latencies, but too soon
    assert after(0, 0.06) == 2  # 0.11 s
    assert after(3, 0.99) == 2  # a few latencies: a window after 1 s
    assert after(0, 0.02) == 3


def test_a_change_of_limit_leaves_out_the_units_that_were_in_flight() -> None:
    """After a climb, the first latencies (of the units in flight at the change) join no window."""
    system = System(waiting, initial=4, high=40)
    system.run(1)  # the first window: 4 -> 8
    assert system.limiter.target == 8
    held = [system.limiter.try_acquire() for _ in range(8)]
    system.controller._move(6, "test")  # down: the 8 units in flight finish first
    assert system.controller.windows.skip == 8
    for _ in held:
        system.limiter.release()
    feed(system.limiter, system.controller, [9.9] * 8, 6)  # the old units' latencies: dropped
    system.controller.adjust(system.now + 1)
    assert system.controller.windows._samples == []
    system.controller._move(16, "test")  # up: the first units of slots never open before warm up
    assert system.controller.windows.skip == windows.WARM_UP * (16 - 8)


# -- the cruise's evidence --------------------------------------------------------------------------


def test_the_lower_neighbour_wins_within_the_tolerance_and_the_higher_needs_a_gain() -> None:
    """Flat throughput: it goes down until fewer units cost more than TOLERANCE; never up for nothing."""
    system = System(lambda limit: 1000.0 if limit >= 6 else 1000.0 * limit / 6 * 0.99, initial=12, high=40)
    system.run(300)
    assert system.home() == 6
    ups = [limit for limit in system.controller.trace.since(0.0)[-40:] if limit[1] > 8]
    assert ups == []  # looks up go to 7 and 8 and no higher


def test_a_side_shown_not_to_pay_is_looked_at_closer_by_and_less_and_less_often() -> None:
    """
    At the ceiling with units that only wait, the looks down go to 15, then (shown to cost more than
    the tolerance) to 18, then 19; the looks space out until MAX_WAIT windows apart, and looking
    closer by does not make them frequent again.
    """
    system = System(waiting, initial=4, high=20)
    limits = system.run(400)
    looks = [(i, limit) for i, limit in enumerate(limits) if limit < 20][1:]  # after the climb (4, 8, 20)
    places = [limit for _, limit in looks]
    assert places[0] == 15
    assert places == sorted(places)
    assert places[-1] == 19
    gaps = [b - a for a, b in itertools.pairwise(i for i, _ in looks)]
    assert gaps == sorted(gaps)
    assert adaptive.MAX_WAIT <= gaps[-1] <= adaptive.MAX_WAIT + 2


# -- overload -------------------------------------------------------------------------------------


def test_overload_cuts_the_limit_by_a_quarter_and_never_below_the_floor() -> None:
    limiter = Limiter(20)
    controller = LimitController(
        limiter, low=3, high=20, initial=20, is_overload=lambda error: isinstance(error, TimeoutError)
    )
    limits = []
    for step in range(10):
        controller.failed(ValueError("not overload"))  # a unit's own error changes nothing
        controller.failed(TimeoutError())
        controller.adjust(float(step))
        limits.append(limiter.limit)
    assert limits[0] == 15
    assert limits == sorted(limits, reverse=True)
    assert limits[-1] == 3


def test_an_attempt_that_started_before_the_cut_does_not_cut_again() -> None:
    """The cut's own units (admitted at the old limit) time out too: one cut, not one each."""
    limiter = Limiter(16)
    controller = LimitController(limiter, low=1, high=20, initial=16, is_overload=lambda e: True)
    controller.failed(TimeoutError(), 5.0)
    controller.adjust(0.0)
    assert limiter.target == 12
    controller.failed(TimeoutError(), 5.0)  # started 5 s ago: before the cut
    controller.adjust(0.02)
    assert limiter.target == 12
    controller.failed(TimeoutError(), 0.0)  # started after it
    controller.adjust(0.04)
    assert limiter.target == 9


def test_after_an_overload_the_limit_does_not_rise_for_a_while() -> None:
    """Units that only wait after a cut: no climb and no look up for CALM_WINDOWS windows."""
    system = System(waiting, initial=16, high=20)
    system.controller._is_overload = lambda error: True
    system.run(3)
    system.controller.failed(TimeoutError())
    system.controller.adjust(system.now)
    cut = system.limiter.target
    calm = system.run(adaptive.CALM_WINDOWS - 1)
    assert max(calm) <= cut
    assert max(system.run(40)) == 20


# -- the trace, and the limiter under a moving limit -------------------------------------------------------


def test_the_trace_records_each_change_and_stays_bounded() -> None:
    system = System(saturating(6), initial=4, high=40, noise=0.15)
    system.run(3000)
    points = system.controller.trace.since(0.0)
    assert len(points) <= adaptive.TRACE_POINTS + 2
    assert points[-1][1] == system.limiter.limit
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
