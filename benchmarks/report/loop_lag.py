"""
The loop-lag part of the report: the table, one-knob comparisons and "What keeps /ping fast".

Every sentence here is computed from the run's own figures: variants that differ in one knob
only (L, the switch interval, the requests in flight, gc.freeze) are compared pairwise, and each
knob gets a verdict from the median change of /ping p99 it caused.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..measurement import Measurement
from .tables import fmt

#: The loop-lag kinds that call the database through a boundeddb runner.
BOUNDEDDB_KINDS = ("semaphore-submit", "thread-offload-submit")
INLINE = "loop-lag inline"
#: The knobs a variant can turn, as ``Measurement.config`` keys, and how the report names them.
KNOBS = {
    "limit": "units in flight L",
    "switch_interval_s": "sys.setswitchinterval",
    "concurrency": "DB requests in flight",
    "gc_freeze": "gc.freeze()",
}
#: A knob "helps" below this factor on /ping p99, "hurts" above the next; between is noise.
HELPS, HURTS = 0.8, 1.25
#: "Keeps the DB throughput": at least this share of the DB req/s it is compared with.
KEEPS = 0.8


def _ms(value: float | None) -> str:
    return fmt(value, 1e3)


def _name(m: Measurement) -> str:
    return m.label.removeprefix("loop-lag ")


def _ok(rows: Iterable[Measurement]) -> list[Measurement]:
    return [m for m in rows if not m.error and m.extra.get("ping_p99_s") and m.ops_per_s]


def _p99(m: Measurement) -> float:
    return float(m.extra["ping_p99_s"])


def _status(m: Measurement) -> str:
    if m.error:
        return m.error.splitlines()[0][:80]
    notes = [f"{m.failed} failed"] if m.failed else []
    if m.extra.get("deadline_hit"):
        notes.append(f"stopped at the deadline after {m.succeeded + m.failed:,} requests")
    return "; ".join(notes)


def loop_table(rows: list[Measurement]) -> list[str]:
    header = [
        "variant", "pings", "/ping p50, ms", "/ping p99, ms", "/ping max, ms", "DB req/s", "DB p99, ms",
        "peak conns", "loop lag p99, ms", "GC max pause, ms", "app CPU, s", "server CPU, s", "notes",
    ]  # fmt: skip
    body = []
    for m in rows:
        x = m.extra
        body.append(
            [
                _name(m),
                str(x.get("ping_count", "-")),
                _ms(x.get("ping_p50_s")),
                _ms(x.get("ping_p99_s")),
                _ms(x.get("ping_max_s")),
                fmt(m.ops_per_s, digits=0),
                _ms(m.p99_s),
                str(m.peak_connections or "-"),
                _ms(m.loop_lag_p99_s),
                _ms(x.get("gc_max_pause_s")),
                fmt(m.client_cpu_s),
                fmt(m.server_cpu_s),
                _status(m),
            ]
        )
    align = ["---"] + ["---:"] * (len(header) - 2) + ["---"]
    return ["| " + " | ".join(r) + " |" for r in [header, align, *body]]


def _knobs(m: Measurement) -> dict[str, Any]:
    c = m.config
    return {
        "variant": c.get("variant"),
        "limit": c.get("limit"),
        "switch_interval_s": round(float(c.get("switch_interval_s") or 0.0), 6),
        "concurrency": c.get("concurrency"),
        "gc_freeze": bool(c.get("gc_freeze")),
    }


@dataclass
class Comparison:
    """Two variants that differ in one knob: ``before`` has the knob's default value."""

    knob: str
    before: Measurement
    after: Measurement

    @property
    def p99_factor(self) -> float:
        return _p99(self.after) / _p99(self.before)

    @property
    def throughput(self) -> float:
        return (self.after.ops_per_s or 0.0) / (self.before.ops_per_s or 1.0)

    def _value(self, m: Measurement) -> str:
        value = _knobs(m)[self.knob]
        if self.knob == "switch_interval_s":
            return f"{value * 1e3:g} ms"
        if self.knob == "gc_freeze":
            return "on" if value else "off"
        return str(value)

    def describe(self) -> str:
        b, a = self.before, self.after
        return (
            f"{_knobs(b)['variant']}, {KNOBS[self.knob]} {self._value(b)} → {self._value(a)}: "
            f"/ping p50 {_ms(b.extra['ping_p50_s'])} → {_ms(a.extra['ping_p50_s'])} ms, "
            f"p99 {_ms(_p99(b))} → {_ms(_p99(a))} ms ({self.p99_factor:.2f}x), "
            f"DB req/s {fmt(b.ops_per_s, digits=0)} → {fmt(a.ops_per_s, digits=0)} ({self.throughput:.0%})"
        )


def comparisons(rows: list[Measurement]) -> list[Comparison]:
    """Every pair of variants that differ in exactly one knob, from the default value to another."""
    ok = _ok(rows)
    defaults = {m.label.removeprefix("loop-lag "): _knobs(m) for m in ok if m.label.count(" ") == 1}
    if not defaults:
        return []
    base = next(iter(defaults.values()))
    out = []
    for before in ok:
        kb = _knobs(before)
        for after in ok:
            ka = _knobs(after)
            differ = [k for k in kb if kb[k] != ka[k]]
            if len(differ) == 1 and differ[0] in KNOBS and kb[differ[0]] == base[differ[0]]:
                out.append(Comparison(differ[0], before, after))
    return out


def best_boundeddb(rows: list[Measurement]) -> tuple[Measurement | None, str]:
    """
    The boundeddb variant with the lowest /ping p99 among all those measured, and a note on its
    DB throughput against inline's (a variant that kept /ping fast by serving less is flagged).
    """
    ok = [m for m in _ok(rows) if m.config.get("variant") in BOUNDEDDB_KINDS]
    if not ok:
        return None, ""
    best = min(ok, key=_p99)
    inline = next((m for m in _ok(rows) if m.label == INLINE), None)
    if inline is None or not inline.ops_per_s:
        return best, "lowest /ping p99"
    share = (best.ops_per_s or 0.0) / inline.ops_per_s
    kept = "" if share >= KEEPS else f", below {KEEPS:.0%}"
    return best, f"lowest /ping p99; {share:.0%} of inline's DB req/s{kept}"


def _get(m: Measurement, key: str) -> float:
    return float(m.extra.get(key) or 1e-9)


def _verdict(knob: str, found: list[Comparison]) -> tuple[float, str]:
    """The median p99 factor of a knob's comparisons, and a sentence about it."""
    factor = statistics.median(c.p99_factor for c in found)
    p50 = statistics.median(_get(c.after, "ping_p50_s") / _get(c.before, "ping_p50_s") for c in found)
    kept = statistics.median(c.throughput for c in found)
    name = KNOBS[knob]
    if factor <= HELPS:
        cost = "kept the DB throughput" if kept >= KEEPS else f"cost DB throughput ({kept:.0%} of it kept)"
        text = f"{name} helped: /ping p99 {factor:.2f}x, p50 {p50:.2f}x (medians), and {cost}"
    elif factor >= HURTS:
        text = f"{name} hurt: /ping p99 {factor:.2f}x (median)"
    else:
        text = f"{name} made no clear difference: /ping p99 {factor:.2f}x (median), within this run's noise"
    return factor, text + f" ({len(found)} comparison{'s' if len(found) > 1 else ''})"


def _rank_from_top(n: int) -> str:
    """Which slowest ping the nearest-rank p99 of ``n`` pings is: "1st" (the slowest), "2nd", ..."""
    k = n - max(1, math.ceil(0.99 * n)) + 1
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _gc_line(ok: list[Measurement]) -> list[str]:
    without = [m.extra.get("gc_full_max_pause_s") for m in ok if not m.config.get("gc_freeze")]
    with_ = [m.extra.get("gc_full_max_pause_s") for m in ok if m.config.get("gc_freeze")]
    w0 = max((v for v in without if v is not None), default=None)
    w1 = max((v for v in with_ if v is not None), default=None)
    if w0 is None:
        return []
    line = f"- Full (generation-2) garbage collections paused the server for up to {_ms(w0)} ms"
    line += f" without gc.freeze() and up to {_ms(w1)} ms with it." if with_ else "."
    return [line]


def ping_paragraph(rows: list[Measurement]) -> list[str]:
    """The "What keeps /ping fast" paragraph, from this run's figures."""
    ok = _ok(rows)
    found = comparisons(rows)
    if not ok:
        return []
    out = ["### What keeps /ping fast", ""]
    inline = next((m for m in ok if m.label == INLINE), None)
    best, rule = best_boundeddb(rows)
    if best is not None and inline is not None:
        out.append(
            f"- Best boundeddb variant ({rule}): {_name(best)}, /ping p50 {_ms(best.extra['ping_p50_s'])}, "
            f"p99 {_ms(_p99(best))}, max {_ms(best.extra['ping_max_s'])} ms at "
            f"{fmt(best.ops_per_s, digits=0)} DB req/s with {best.peak_connections} connections; "
            f"inline AsyncSession: p99 {_ms(_p99(inline))} ms at {fmt(inline.ops_per_s, digits=0)} DB req/s "
            f"with {inline.peak_connections}: p99 {_p99(inline) / _p99(best):.1f}x lower."
        )
    by_knob: dict[str, list[Comparison]] = {}
    for c in found:
        by_knob.setdefault(c.knob, []).append(c)
    verdicts = sorted((*_verdict(k, cs), k) for k, cs in by_knob.items())
    out += [f"- {text}." for _, text, _ in verdicts]
    out += _gc_line(ok)
    helped = [KNOBS[k] for factor, _, k in verdicts if factor <= HELPS]
    if helped:
        out.append(f"- In this run, what kept /ping fast: {', then '.join(helped)}.")
    out += ["", "One-knob comparisons (each variant against the one that differs from it in that knob):", ""]
    out += [f"- {c.describe()}" for c in sorted(found, key=lambda c: (c.knob, c.p99_factor))]
    pings = sorted(int(m.extra.get("ping_count", 0)) for m in ok)
    out += [
        "",
        f"Each variant ran once, with {pings[0]}-{pings[-1]} pings: its p99 is the "
        f"{_rank_from_top(pings[0])} to {_rank_from_top(pings[-1])} slowest ping, so a single run's p99 "
        f"is noisy; factors between {HELPS}x and {HURTS}x are treated as no clear difference.",
        "",
    ]
    return out
