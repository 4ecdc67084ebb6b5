"""
``overhead``: boundeddb's runners against their hand-rolled twins, interleaved, over K rounds.

The overhead targets (``semaphore`` and ``threads`` within 5% of the hand-rolled strategies)
compare two runs, and on a shared 2-core machine throughput drifts by about ±10% from one
minute to the next: one ``semaphore`` run followed by one ``hand-rolled`` run can read 0.84 when
the same pair, interleaved and repeated, gives about 0.95.  So this scenario measures each pair

* ``semaphore``: ``SemaphoreRunner(L)`` against ``asyncio.Semaphore(L)`` + AsyncSession (asyncpg);
* ``threads``: ``ThreadOffloadRunner(L)`` against ``ThreadPoolExecutor(L)`` + Session (psycopg);

in ABBA order: in every round each pair runs its two sides back to back, library first in even
rounds and hand-rolled first in odd ones (AB, BA, AB, ...), so that a slow drift of the machine
favours neither side, and a round's ratio compares two neighbouring runs.  Every measurement
runs the first ``min(N, 3000)`` ops of the sequence on fresh tables, with the scenarios' own
code (``semaphore.measure``, ``threads.measure``, ``hand_rolled.measure_*``).  A short warm-up of
each strategy, not recorded, comes first.  The report gives per pair the median ops/s of each
side and the median, min and max of the per-round ratios library / hand-rolled;
``--overhead-rounds`` sets K (default 3).  As a cross-check that depends less on other
processes' load, it also gives the per-round ratio of this process's CPU time per op,
hand-rolled / library (in the same sense: above 1 means the library spent less).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from typing import Any

from . import hand_rolled, semaphore, threads
from ._harness import Context, Measurement
from ._workload import Op

#: The most ops one overhead measurement runs (N_overhead = min(N, this)).
MAX_OPS = 3_000
DEFAULT_ROUNDS = 3
WARMUP_OPS = 100
GROUP = "overhead"
LIBRARY, HAND_ROLLED = "library", "hand-rolled"
#: pair -> (name of the ratio in the report, library label, hand-rolled label)
PAIRS: dict[str, tuple[str, str, str]] = {
    "semaphore": ("semaphore / hand-rolled", "semaphore", "hand-rolled"),
    "threads": ("threads / hand-rolled threads", "threads", "hand-rolled-threads"),
}

Measure = Callable[[Context, int, list[Op], str, str], None]


def _semaphore(ctx: Context, limit: int, ops: list[Op], group: str, label: str) -> None:
    asyncio.run(semaphore.measure(ctx, limit, ops, group=group, label=label))


def _hand_rolled(ctx: Context, limit: int, ops: list[Op], group: str, label: str) -> None:
    asyncio.run(hand_rolled.measure_async(ctx, limit, ops, group=group, label=label))


def _threads(ctx: Context, limit: int, ops: list[Op], group: str, label: str) -> None:
    asyncio.run(threads.measure(ctx, limit, ops, driver="psycopg", group=group, label=label))


def _hand_rolled_threads(ctx: Context, limit: int, ops: list[Op], group: str, label: str) -> None:
    hand_rolled.measure_threads(ctx, limit, ops, group=group, label=label)


SIDES: dict[str, dict[str, Measure]] = {
    "semaphore": {LIBRARY: _semaphore, HAND_ROLLED: _hand_rolled},
    "threads": {LIBRARY: _threads, HAND_ROLLED: _hand_rolled_threads},
}


def _name(pair: str, side: str) -> str:
    return PAIRS[pair][1 if side == LIBRARY else 2]


def run(ctx: Context) -> None:
    ops = ctx.ops[: min(len(ctx.ops), MAX_OPS)]
    rounds = max(1, ctx.overhead_rounds)
    warm = ops[:WARMUP_OPS]
    before = len(ctx.results)
    for pair, sides in SIDES.items():
        for side, measure in sides.items():
            measure(ctx, ctx.limit, warm, "warm-up", f"warm-up {_name(pair, side)}")
    del ctx.results[before:]  # the warm-up is not a result
    for k in range(rounds):
        order = (LIBRARY, HAND_ROLLED) if k % 2 == 0 else (HAND_ROLLED, LIBRARY)
        for pair, sides in SIDES.items():
            for position, side in enumerate(order):
                label = f"{_name(pair, side)} (L={ctx.limit}) round {k + 1}"
                first = len(ctx.results)
                sides[side](ctx, ctx.limit, ops, GROUP, label)
                for m in ctx.results[first:]:
                    m.config.update(pair=pair, side=side, round=k + 1, position="AB"[position])


def _ok(m: Measurement) -> bool:
    return not m.error and not m.failed and bool(m.ops_per_s) and bool(m.client_cpu_s)


def _cpu_per_op(m: Measurement) -> float:
    """This process's CPU seconds per op, all its threads."""
    return (m.client_cpu_s or 0.0) / max(1, m.succeeded)


def summary(rows: list[Measurement], schema: str) -> dict[str, dict[str, Any]]:
    """
    Per pair: median ops/s of each side, and the median, min and max of the per-round ratios
    library / hand-rolled (rounds where either side failed are left out).
    """
    out: dict[str, dict[str, Any]] = {}
    rows = [m for m in rows if m.group == GROUP and m.schema == schema]
    for pair, (ratio_name, _, _) in PAIRS.items():
        mine = [m for m in rows if m.config.get("pair") == pair]
        if not mine:
            continue
        by_round: dict[int, dict[str, Measurement]] = {}
        for m in mine:
            by_round.setdefault(int(m.config["round"]), {})[str(m.config["side"])] = m
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        orders: list[str] = []
        for k in sorted(by_round):
            lib, hand = by_round[k].get(LIBRARY), by_round[k].get(HAND_ROLLED)
            if lib and hand and _ok(lib) and _ok(hand):
                ratios.append((lib.ops_per_s or 0.0) / (hand.ops_per_s or 1.0))
                cpu_ratios.append(_cpu_per_op(hand) / _cpu_per_op(lib))
                orders.append("AB" if lib.config.get("position") == "A" else "BA")
        done = [m for m in mine if _ok(m)]
        lib_ops = [m.ops_per_s or 0.0 for m in done if m.config["side"] == LIBRARY]
        hand_ops = [m.ops_per_s or 0.0 for m in done if m.config["side"] == HAND_ROLLED]
        lib_cpu = [_cpu_per_op(m) for m in done if m.config["side"] == LIBRARY]
        hand_cpu = [_cpu_per_op(m) for m in done if m.config["side"] == HAND_ROLLED]
        out[pair] = {
            "ratio_name": ratio_name,
            "rounds": len(by_round),
            "n": mine[0].n,
            "limit": mine[0].config.get("limit"),
            "library_median_ops_s": statistics.median(lib_ops) if lib_ops else None,
            "hand_rolled_median_ops_s": statistics.median(hand_ops) if hand_ops else None,
            "ratios": ratios,
            "orders": orders,
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios, default=None),
            "ratio_max": max(ratios, default=None),
            "library_cpu_ms_per_op": statistics.median(lib_cpu) * 1e3 if lib_cpu else None,
            "hand_rolled_cpu_ms_per_op": statistics.median(hand_cpu) * 1e3 if hand_cpu else None,
            "cpu_ratios": cpu_ratios,
            "cpu_ratio_median": statistics.median(cpu_ratios) if cpu_ratios else None,
            "cpu_ratio_min": min(cpu_ratios, default=None),
            "cpu_ratio_max": max(cpu_ratios, default=None),
            "errors": [m.error for m in mine if m.error],
            "loadavg_1m": [m.extra["loadavg_1m"] for m in mine if "loadavg_1m" in m.extra],
        }
    return out
