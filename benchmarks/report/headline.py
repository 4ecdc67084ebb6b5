"""
The few figures a run ends with: what to look at first, each computed from the run's own rows.

At most five lines, in this order, each only where the run has its rows: throughput and
connections of the post's strategies and the runners, the library's overhead, the limit sweep's
best limits, /ping under load, and the targets' count; or, for the other studies, their
section's main figure.
"""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios.overhead import goals
from ..stats import by_fixed_limit, measured, median_of
from .loop_lag import INLINE, best_boundeddb
from .tables import MACHINE_LIMIT, UNDECIDED, median_rows
from .throughput import RUNNERS

#: The throughput rows the first line names, when they ran: the post's three strategies.
POST_ROWS = ("sync", "async-unbounded", "chunked")
MOST = 5
#: The statuses the targets' line counts; ``n/a`` (the target's scenario did not run) it does not.
STATUSES = ("PASS", "MISS", "FAIL", UNDECIDED, MACHINE_LIMIT)


def _connections(m: Measurement) -> str:
    n = m.peak_connections or 0
    return f"{n} connection{'s' if n != 1 else ''}"


def _throughput(main: list[Measurement]) -> str | None:
    rows = [m for m in measured(main) if m.schema == "faithful"]
    if not rows:
        return None
    runner = max((m for m in rows if m.scenario in RUNNERS), key=lambda m: m.ops_per_s or 0.0, default=None)
    picked = [m for name in POST_ROWS for m in rows if m.scenario == name]
    picked += [runner] if runner is not None else []
    shown = ", ".join(f"{m.label} {m.ops_per_s or 0:,.0f} ops/s ({_connections(m)})" for m in picked)
    return f"Throughput (the post's schema): {shown}."


def _overhead(data: dict[str, Any]) -> str | None:
    pairs = data.get("overhead", {}).get("faithful", {})
    found = [
        (s["ratio_name"], s["ratio_median"], len(s["ratios"])) for s in pairs.values() if s["ratio_median"]
    ]
    if not found:
        return None
    target = goals(name for name, s in pairs.items() if s["ratio_median"])
    shown = ", ".join(f"{name} {ratio:.3f}" for name, ratio, _ in found)
    k = max(n for *_, n in found)
    rounds = (
        f"median of {k} rounds; target {target}"
        if k > 1
        else f"1 round, a first look: the target, {target}, wants --overhead-rounds 5"
    )
    return f"Library / hand-written ops/s ({rounds}): {shown}."


def _sweep(results: list[Measurement]) -> str | None:
    rows = [m for m in measured(results) if m.group == "sweep" and m.schema == "faithful"]
    best = []
    for runner in sorted({m.scenario for m in rows}):
        points = by_fixed_limit(m for m in rows if m.scenario == runner)
        means = {limit: median_of([m.ops_per_s for m in ms]) or 0.0 for limit, ms in points.items()}
        if means:
            limit = max(means, key=lambda k: means[k])
            best.append(f"{runner} at L={limit} ({means[limit]:,.0f} ops/s)")
    return f"Limit sweep: the most ops/s came from {' and '.join(best)}." if best else None


def _loop_lag(results: list[Measurement]) -> str | None:
    rows = [m for m in results if m.group == "loop-lag"]
    inline = next((m for m in rows if m.label == INLINE and not m.error), None)
    best, _ = best_boundeddb(rows)
    if inline is None or best is None or not inline.extra.get("ping_p99_s"):
        return None
    name = best.label.removeprefix("loop-lag ")
    return (
        "/ping p99 while the app serves DB requests: inline AsyncSession "
        f"{inline.extra['ping_p99_s'] * 1e3:.1f} ms, the best boundeddb variant ({name}) "
        f"{best.extra['ping_p99_s'] * 1e3:.1f} ms."
    )


def _dig(data: dict[str, Any], *paths: str) -> list[Any] | None:
    """The value at each dotted path of ``data`` (``"fleet.sides.pooler"``); None if one is missing."""
    found = []
    for path in paths:
        value: Any = data
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            return None
        found.append(value)
    return found


def _mixed(data: dict[str, Any]) -> str | None:
    got = _dig(data, "mixed.variants.reserve.wait_p99_ms", "mixed.variants.none.wait_p99_ms")
    if got is None:
        return None
    return (
        f"Short units beside a bulk run: wait p99 {got[0]:.2f} ms with priority=1 and reserve=1, "
        f"{got[1]:.2f} ms with neither."
    )


def _post002(data: dict[str, Any]) -> str | None:
    claim = next(
        (
            c
            for c in data.get("post_002", {}).get("claims", [])
            if (c["aiomysql"], c["sync"]) == ("aiomysql-tx", "sa-tx")
        ),
        None,
    )
    if not claim or not claim.get("ratios"):
        return None
    return (
        f"Post 002, transactions: aiomysql / sync time {claim['median']:.2f} (median of "
        f"{len(claim['ratios'])} rounds); sync faster in {claim['sync_faster_rounds']} of them."
    )


def _post004(results: list[Measurement]) -> str | None:
    ping = {
        m.config.get("way"): m.extra.get("ping_mean_s")
        for m in results
        if m.group == "post-004" and not m.error and m.config.get("database") == "postgresql"
    }
    if ping.get("inline") is None or ping.get("offload") is None:
        return None
    return (
        f"Post 004, /ping during 100 slow requests (PostgreSQL): {ping['inline']:.2f} s mean with "
        f"AsyncSession in the endpoint, {ping['offload']:.2f} s with ThreadOffloadRunner.submit."
    )


def _fleet(data: dict[str, Any]) -> str | None:
    got = _dig(data, "fleet.sides.pooler.peak_server_connections", "fleet.pooler_vs_direct.ops_ratio")
    if got is None:
        return None
    peak, ratio = got
    return (
        f"Fleet through PgBouncer: at most {peak} server connections, "
        f"ops/s {ratio:.2f} of the same processes direct."
    )


def _processes(data: dict[str, Any]) -> str | None:
    schemas = data.get("processes", {})
    schema = "index" if "index" in schemas else "faithful"
    ratios, sides = schemas.get(schema, {}).get("ratios", {}), schemas.get(schema, {}).get("sides", {})
    speedup, hand = ratios.get("process-2 / semaphore", {}), ratios.get("process-2 / hand-written-2", {})
    if not speedup.get("geomean") or "process-2" not in sides:
        return None
    shown = f"{hand['geomean']:.2f}x the hand-written pool, " if hand.get("geomean") else ""
    return (
        f"Processes ({schema} schema, L=8, start-up included): ProcessRunner(2) "
        f"{sides['process-2']['ops_per_s']:,.0f} ops/s, {speedup['geomean']:.2f}x one SemaphoreRunner, "
        f"{shown}start-up {sides['process-2']['startup_s']:.1f} s."
    )


def _instructions(data: dict[str, Any]) -> str | None:
    pairs = [
        (name, p)
        for name, schema in data.get("instructions", {}).items()
        for p in schema.values()
        if p["ratio"]
    ]
    if not pairs:
        return None
    shown = ", ".join(f"{p['ratio_name']} ({schema}) {p['ratio']:.3f}" for schema, p in pairs)
    target = goals(dict.fromkeys(name for s in data.get("instructions", {}).values() for name in s))
    return f"Instructions per op, hand-written / library (target {target}): {shown}."


def _targets(data: dict[str, Any]) -> str | None:
    found = data.get("targets", [])
    counts = {s: sum(1 for t in found if t["status"] == s) for s in STATUSES}
    if not any(counts.values()):
        return None
    shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    rest = "; the others' scenarios did not run here" if len(found) > sum(counts.values()) else ""
    return f"Targets: {shown} (the report's last section; reported, not asserted{rest})."


def headline(results: list[Measurement], data: dict[str, Any]) -> list[str]:
    """Up to five lines of the run's main figures (see the module docstring)."""
    main = [m for m in results if m.group == "main"]
    if any(int(m.config.get("round", 1)) > 1 for m in main):
        main = median_rows(main)
    found = [
        _throughput(main),
        _overhead(data),
        _sweep(results),
        _loop_lag(results),
        _mixed(data),
        _post004(results),
        _fleet(data),
        _processes(data),
        _instructions(data),
        _post002(data),
    ]
    lines = [line for line in found if line][: MOST - 1]
    if (targets := _targets(data)) is not None:
        lines.append(targets)
    return lines
