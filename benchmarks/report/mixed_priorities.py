"""The report's "Priorities and a reserve" section, its goals and its wait chart (the ``mixed`` scenario)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ..measurement import Measurement
from ..scenarios import mixed_priorities as mixed
from ..scenarios.loop_lag import BULK_KIND
from ..stats import measured as _ok
from ..stats import median_of as _median
from .charts import plt
from .tables import fmt

#: With a reserve, the interactive units' wait p99 (median of the rounds) is at most this.
WAIT_P99_MS = 5.0
#: With a reserve, the bulk run keeps at least this share of its ops/s alone at ``L - reserve``.
BULK_SHARE = 0.9
#: How each measurement is named in the report.
NAMES = {
    "baseline": f"bulk alone, L={mixed.LIMIT - mixed.RESERVE}",
    "none": f"priority 0, L={mixed.LIMIT}",
    "priority": f"priority=1, L={mixed.LIMIT}",
    "reserve": f"priority=1, reserve={mixed.RESERVE}, L={mixed.LIMIT}",
}


def _bulk_ratios(rows: list[Measurement], name: str) -> list[float]:
    """Per round: the variant's bulk ops/s / the baseline's (the bulk run alone at L - reserve)."""
    out = []
    for k in sorted({m.config["round"] for m in rows}):
        side = {m.config["variant"]: m for m in rows if m.config["round"] == k}
        a, b = side.get(name), side.get("baseline")
        if a and b and a.ops_per_s and b.ops_per_s:
            out.append(a.ops_per_s / b.ops_per_s)
    return out


def summary(rows: list[Measurement]) -> dict[str, dict[str, Any]]:
    """Per variant: the medians of the rounds' figures, and the bulk ratio to the baseline."""
    rows = _ok(rows)
    out: dict[str, dict[str, Any]] = {}
    for name in NAMES:
        mine = [m for m in rows if m.config.get("variant") == name]
        if not mine:
            continue

        def med(key: str, mine: list[Measurement] = mine) -> float | None:
            return _median([m.extra.get(key) for m in mine])

        ratios = _bulk_ratios(rows, name) if name != "baseline" else []
        out[name] = {
            "rounds": len(mine),
            "bulk_ops_s": _median([m.ops_per_s for m in mine]),
            "bulk_ratios": [round(r, 3) for r in ratios],
            "bulk_ratio": statistics.median(ratios) if ratios else None,
            "bulk_busy_share": med("bulk_busy_share"),
            "max_in_flight": max((m.extra.get("max_in_flight") or 0 for m in mine), default=None),
            "interactive_counted": sum(m.extra.get("interactive_counted") or 0 for m in mine),
            "interactive_failed": sum(m.extra.get("interactive_failed") or 0 for m in mine),
            "wait_over_5ms": sum(m.extra.get("wait_over_5ms") or 0 for m in mine),
            "wait_p99_rounds": [m.extra.get("wait_p99_ms") for m in mine],
            **{
                key: med(key)
                for key in (
                    "wait_p50_ms",
                    "wait_p99_ms",
                    "wait_max_ms",
                    "response_p50_ms",
                    "response_p99_ms",
                    "schedule_late_p99_ms",
                )
            },
        }
    return out


def _note(m: Measurement) -> str:
    problem = m.error or m.extra.get("bulk_error")
    return str(problem).splitlines()[0][:80] if problem else ""


def _bulk_loop_lag(rows: list[Measurement]) -> list[str]:
    """The loop-lag variants with a bulk job on the endpoints' runner, beside the same app without it."""
    mine = [m for m in rows if m.config.get("variant") == BULK_KIND]
    plain = [
        m for m in rows
        if m.config.get("variant") == "semaphore-submit" and m.config.get("limit") == mixed.LIMIT
        and not m.config.get("gc_freeze") and m.label.count(" ") == 2
    ]  # fmt: skip
    if not mine:
        return []
    header = [
        "variant", "endpoint p50, ms", "endpoint p99, ms", "DB req/s", "/ping p99, ms",
        "bulk units/s", "peak conns", "notes",
    ]  # fmt: skip
    body = []
    for m in plain + mine:
        x = m.extra
        body.append(
            [
                m.label.removeprefix("loop-lag "),
                fmt(m.p50_s and m.p50_s * 1e3),
                fmt(m.p99_s and m.p99_s * 1e3),
                fmt(m.ops_per_s, digits=0),
                fmt(x.get("ping_p99_s") and x["ping_p99_s"] * 1e3),
                fmt(x.get("bulk_ops_s")) if m in mine else "no bulk job",
                str(m.peak_connections or "-"),
                _note(m),
            ]
        )
    align = ["---"] + ["---:"] * (len(header) - 2) + ["---"]
    return [
        "The loop-lag web app with a backfill on the endpoints' own runner "
        f"(`SemaphoreRunner` L={mixed.LIMIT}, the bulk units of this section at priority 0 for the whole "
        "variant; an endpoint's latency is its whole request, the unit's wait included):",
        "",
        *("| " + " | ".join(r) + " |" for r in [header, align, *body]),
        "",
    ]


def section(rows: list[Measurement], loop_rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The Markdown lines of the section and its data."""
    data: dict[str, Any] = {"variants": summary(rows)}
    ok = _ok(rows)
    k = max((int(m.config.get("round", 0)) for m in ok), default=0)
    n = ok[0].config.get("bulk_units") if ok else "-"
    header = [
        "measurement", "wait p50, ms", "wait p99, ms", "wait max, ms", "waits > 5 ms", "response p99, ms",
        "bulk ops/s", "bulk / alone", "bulk slots busy", "peak in flight",
    ]  # fmt: skip
    body = []
    for name, v in data["variants"].items():
        interactive = name != "baseline"
        body.append(
            [
                NAMES[name],
                fmt(v["wait_p50_ms"], digits=2) if interactive else "-",
                fmt(v["wait_p99_ms"], digits=2) if interactive else "-",
                fmt(v["wait_max_ms"], digits=1) if interactive else "-",
                f"{v['wait_over_5ms']:,} of {v['interactive_counted']:,}" if interactive else "-",
                fmt(v["response_p99_ms"], digits=2) if interactive else "-",
                fmt(v["bulk_ops_s"], digits=2),
                fmt(v["bulk_ratio"], digits=3) if interactive else "1",
                "-" if v["bulk_busy_share"] is None else f"{v['bulk_busy_share']:.0%}",
                str(v["max_in_flight"]),
            ]
        )
    align = ["---"] + ["---:"] * (len(header) - 1)
    errors = [f"- {m.label} (round {m.config.get('round')}): {m.error}" for m in rows if m.error]
    lines = [
        f"## Priorities and a reserve ({k} ABBA rounds, {n} bulk units each)",
        "",
        *("| " + " | ".join(r) + " |" for r in [header, align, *body]),
        "",
        *errors,
        *([""] if errors else []),
        "A bulk `SemaphoreRunner.run()` of units of "
        f"{mixed.SLEEP_MIN_S * 1e3:.0f}-{mixed.SLEEP_MAX_S * 1e3:.0f} ms of `pg_sleep` and a one-row insert, "
        "while another task submits a one-row primary-key read every "
        f"{1e3 / mixed.RATE_HZ:.0f} ms (open loop) with `runner.submit`.  The wait is from just before "
        "`submit` to the unit's first line (the slot granted, the session open); the response is the whole "
        "`submit`.  Only the interactive units submitted while the bulk run still had units to pull count.  "
        '"bulk / alone" is the median of the rounds\' bulk ops/s over the bulk run alone at '
        f'L={mixed.LIMIT - mixed.RESERVE} in the same round; "bulk slots busy" the mean share of the '
        "bulk's slots (L - reserve) running a bulk unit, sampled every "
        f'{mixed.SAMPLE_S * 1e3:.0f} ms; "peak in flight" the most units in flight across priorities '
        "from `runner.statistics()`.  Figures are medians of the rounds.",
        "",
        *_bulk_loop_lag(loop_rows),
    ]
    return lines, data


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    v = data.get("variants", {}).get("reserve")
    out = []
    name = (
        f"mixed: with a reserve, interactive wait p99 <= {WAIT_P99_MS:g} ms "
        "while the bulk run saturates its slots"
    )
    p99 = v and v["wait_p99_ms"]
    busy = v and v["bulk_busy_share"]
    if v and p99 is not None:
        each = ", ".join(fmt(x, digits=2) for x in v["wait_p99_rounds"])
        shown = (
            f"{p99:.2f} ms (median of the rounds' p99: {each}); bulk slots busy {busy:.0%}"
            if busy is not None
            else f"{p99:.2f} ms"
        )
        out.append(
            {"target": name, "value": p99, "status": "PASS" if p99 <= WAIT_P99_MS else "MISS", "shown": shown}
        )
    else:
        out.append({"target": name, "value": None, "status": "n/a", "shown": "-"})
    name = f"mixed: with a reserve, bulk ops/s >= {BULK_SHARE} of the bulk run alone at L - reserve"
    ratio = v and v["bulk_ratio"]
    if v and ratio is not None:
        shown = (
            f"{ratio:.3f} (median of {len(v['bulk_ratios'])} rounds: {', '.join(map(str, v['bulk_ratios']))})"
        )
        out.append(
            {
                "target": name,
                "value": ratio,
                "status": "PASS" if ratio >= BULK_SHARE else "MISS",
                "shown": shown,
            }
        )
    else:
        out.append({"target": name, "value": None, "status": "n/a", "shown": "-"})
    return out


def chart(path: Path, rows: list[Measurement]) -> Path | None:
    """The interactive units' wait, every round pooled: the share of units that waited longer than x."""
    rows = [m for m in _ok(rows) if m.extra.get("waits_ms")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    for name in ("none", "priority", "reserve"):
        waits = sorted(w for m in rows if m.config.get("variant") == name for w in m.extra["waits_ms"])
        if not waits:
            continue
        floor = 0.01  # ms: the log axis needs a positive value
        xs = [max(w, floor) for w in waits]
        ys = [1 - i / len(waits) for i in range(len(waits))]
        ax.step(
            xs, ys, where="post", label=f"{NAMES[name]} (p99 {waits[int(0.99 * (len(waits) - 1))]:.1f} ms)"
        )
    ax.axvline(
        WAIT_P99_MS, color="grey", linestyle="--", linewidth=1, label=f"goal: p99 <= {WAIT_P99_MS:g} ms"
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("interactive unit's wait for a slot and a session, ms")
    ax.set_ylabel("share of interactive units that waited longer")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(
        f"Short units submitted beside a bulk run (L={mixed.LIMIT}, bulk units "
        f"{mixed.SLEEP_MIN_S * 1e3:.0f}-{mixed.SLEEP_MAX_S * 1e3:.0f} ms)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
