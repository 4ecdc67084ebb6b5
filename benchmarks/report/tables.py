"""Markdown building blocks of the report: numbers as text, tables, and the main, sweep and memory tables."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..measurement import Measurement
from ..stats import median_of


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    """``value * scale`` with thousands separators and ``digits`` decimals, ``-`` for None."""
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def row(cells: Iterable[str]) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(cells) + " |"


def table(header: list[str], rows: list[list[str]], *, text_columns: int = 1) -> list[str]:
    """A Markdown table: ``text_columns`` left-aligned columns, numbers right-aligned, notes last."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - 1 - text_columns) + ["---"]
    return [row(header), row(align), *(row(r) for r in rows)]


def rounds(n: int) -> str:
    """``1 round``, ``5 rounds``."""
    return f"{n} round" if n == 1 else f"{n} rounds"


#: The status of a target whose measurements cannot tell PASS from MISS (too few rounds for the noise).
UNDECIDED = "not decided"
#: The status of an absolute goal missed where the same run's hand-written reference misses it too:
#: the machine's limit that day, not the library's.
MACHINE_LIMIT = "machine's limit"
#: How far one measurement of ops/s moves from round to round on the shared 2-core machine.
NOISE = 0.10


def verdict(value: float | None, goal: float, *, at_most: bool = False, decided: bool = True) -> str:
    """
    A target's status: PASS at ``goal`` or above (``at_most``: at or below), MISS else, n/a without a
    value, :data:`UNDECIDED` where the caller says the measurements cannot decide (``decided=False``).
    """
    if value is None:
        return "n/a"
    if not decided:
        return UNDECIDED
    return "PASS" if (value <= goal if at_most else value >= goal) else "MISS"


def status(m: Measurement) -> str:
    """A row's notes: its error's first line, or how many units failed."""
    if m.error:
        return m.error.splitlines()[0][:80]
    return f"{m.failed} failed" if m.failed else ""


def _time_and_rate(m: Measurement) -> list[str]:
    return [fmt(m.wall_s), fmt(m.ops_per_s, digits=0)]


def _latencies(m: Measurement) -> list[str]:
    return [fmt(m.p50_s, 1e3), fmt(m.p99_s, 1e3)]


def main_table(rows: list[Measurement], *, driver_column: bool = False) -> list[str]:
    rounds = any("ops_per_s_range" in m.extra for m in rows)
    header = [
        "scenario",
        *(["driver"] if driver_column else []),
        "time, s",
        "ops/s",
        *(["ops/s min-max", "rounds"] if rounds else []),
        "p50, ms",
        "p99, ms",
        "peak conns",
        "client CPU, s",
        "server CPU, s",
        "loop lag p99, ms",
        "notes",
    ]
    body = [
        [
            m.label,
            *([str(m.config.get("driver", "-"))] if driver_column else []),
            *_time_and_rate(m),
            *([_range_of(m), str(m.extra.get("rounds", 1))] if rounds else []),
            *_latencies(m),
            str(m.peak_connections) if m.peak_connections is not None else "-",
            fmt(m.client_cpu_s),
            fmt(m.server_cpu_s),
            fmt(m.loop_lag_p99_s, 1e3),
            status(m),
        ]
        for m in rows
    ]
    return table(header, body, text_columns=2 if driver_column else 1)


def _range_of(m: Measurement) -> str:
    low_high = m.extra.get("ops_per_s_range")
    return f"{low_high[0]:,.0f}-{low_high[1]:,.0f}" if low_high else "-"


def median_rows(rows: list[Measurement]) -> list[Measurement]:
    """
    One row per label for a run with ``--rounds`` above 1: the median of each figure over the rounds
    that ran without error, the round count and the ops/s range in ``extra``; rows of one round pass.
    """
    by_label: dict[str, list[Measurement]] = {}
    for m in rows:
        by_label.setdefault(m.label, []).append(m)
    out = []
    for label, ms in by_label.items():
        ok = [m for m in ms if not m.error and m.ops_per_s]
        if len(ms) == 1 or not ok:
            out.append(ms[0])
            continue

        def med(attr: str, ok: list[Measurement] = ok) -> float | None:
            return median_of([getattr(m, attr) for m in ok])

        first = ok[0]
        out.append(
            dataclasses.replace(
                first,
                label=label,
                wall_s=med("wall_s"),
                ops_per_s=med("ops_per_s"),
                p50_s=med("p50_s"),
                p99_s=med("p99_s"),
                max_s=max((m.max_s or 0.0) for m in ok),
                peak_connections=max((m.peak_connections or 0) for m in ok),
                client_cpu_s=med("client_cpu_s"),
                server_cpu_s=med("server_cpu_s"),
                loop_lag_p99_s=med("loop_lag_p99_s"),
                failed=sum(m.failed for m in ms),
                config={k: v for k, v in first.config.items() if k not in ("round", "order")},
                extra={
                    **first.extra,
                    "rounds": len(ok),
                    "rounds_failed": len(ms) - len(ok),
                    "ops_per_s_range": [
                        min(m.ops_per_s or 0.0 for m in ok),
                        max(m.ops_per_s or 0.0 for m in ok),
                    ],
                    "ops_per_s_rounds": [round(m.ops_per_s or 0.0, 1) for m in ok],
                },
                error=None,
            )
        )
    return out


def _sweep_key(m: Measurement) -> tuple[str, str, int, int]:
    limit = m.config.get("limit", 0)
    return (m.schema, m.scenario, limit if isinstance(limit, int) else 1_000_000, m.config.get("pass", 1))


def _limit_shown(m: Measurement) -> str:
    limit = m.config.get("limit", "")
    mean = m.extra.get("limit_mean")
    if limit == "auto" and mean:
        return f"auto (mean {mean:.1f})"
    return f"{limit} (pass {m.config['pass']})" if m.config.get("pass", 1) > 1 else str(limit)


def sweep_table(rows: list[Measurement]) -> list[str]:
    header = ["runner", "schema", "L", "time, s", "ops/s", "p50, ms", "p99, ms", "peak conns"]
    header += ["server CPU, s", "notes"]
    body = [
        [
            m.scenario,
            m.schema,
            _limit_shown(m),
            *_time_and_rate(m),
            *_latencies(m),
            str(m.peak_connections or "-"),
            fmt(m.server_cpu_s),
            status(m),
        ]
        for m in sorted(rows, key=_sweep_key)
    ]
    return table(header, body)


def memory_table(rows: list[Measurement]) -> list[str]:
    header = ["run", "time, s", "units/s", "p50, ms", "p99, ms", "peak conns", "RSS growth, MiB", "notes"]
    body = [
        [
            m.label,
            *_time_and_rate(m),
            *_latencies(m),
            str(m.peak_connections or "-"),
            fmt(m.rss_growth_mb),
            status(m),
        ]
        for m in rows
    ]
    return table(header, body)


def rows_ok(m: Measurement) -> bool:
    """Whether a measurement's rows, counted after it, were as expected."""
    return bool((m.extra.get("rows") or {}).get("ok")) and not m.error


def rows_shown(ms: dict[int, Measurement], *, none_wrong: str = "") -> str:
    """
    ``ok`` if every round's row counts were as expected; else the first wrong round's counts, found
    against expected (``none_wrong`` where no count differs but the check failed).
    """
    for r, m in sorted(ms.items()):
        check = m.extra.get("rows")
        if m.error or not check:
            return "-"
        if check["ok"]:
            continue
        found, expected = check["found"], check["expected"]
        wrong = [f"{k} {found.get(k, 0):,}/{v:,}" for k, v in expected.items() if found.get(k) != v]
        if not wrong and none_wrong:
            wrong = [none_wrong]
        return f"FAIL{f' (round {r})' if len(ms) > 1 else ''}: " + ", ".join(wrong)
    return "ok"
