"""The report's post-002 section: each variant over the rounds, the post's claims checked, the answer."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ..measurement import Measurement
from ..scenarios.post002_mysql_sync_vs_async import CLAIMS, LOOP
from ..stats import median_of
from .charts import plt
from .tables import fmt, rounds, row


def summary(rows: list[Measurement]) -> dict[str, Any]:
    """Per variant: medians and spreads over the rounds; per claim: the per-round time ratios."""
    runs = [m for m in rows if m.config.get("variant") not in (None, "check")]
    by_variant: dict[str, list[Measurement]] = {}
    for m in runs:
        by_variant.setdefault(m.config["variant"], []).append(m)
    out: dict[str, Any] = {"variants": {}, "claims": [], "check": None}
    for key, ms in by_variant.items():
        ok = [m for m in ms if not m.error and m.wall_s]
        first = ms[0]
        out["variants"][key] = {
            "label": first.label,
            "test": first.config.get("test"),
            "driver": first.config.get("driver"),
            "what": first.config.get("what"),
            "rounds": len(ok),
            "errors": sorted({m.error for m in ms if m.error}),
            "wall_ms_median": median_of([(m.wall_s or 0) * 1e3 for m in ok]),
            "wall_ms_min": min(((m.wall_s or 0) * 1e3 for m in ok), default=None),
            "wall_ms_max": max(((m.wall_s or 0) * 1e3 for m in ok), default=None),
            "inserts_per_s_median": median_of([m.ops_per_s for m in ok]),
            "cpu_ms_per_insert_median": median_of([(m.client_cpu_s or 0) * 1e3 / m.n for m in ok if m.n]),
            "p99_ms_median": median_of([(m.p99_s or 0) * 1e3 for m in ok]),
            "connections_opened": sorted({m.extra.get("connections_opened") for m in ok}),
            "rows_committed": sorted({m.extra.get("rows_committed") for m in ok}),
            "autocommit": sorted({m.extra.get("autocommit") for m in ok}, key=str),
        }
    for test, a, s, expected in CLAIMS:
        ratios, orders, cpu_ratios = [], [], []
        rounds = sorted({m.config["round"] for m in runs})
        for r in rounds:
            am = next((m for m in by_variant.get(a, []) if m.config["round"] == r and not m.error), None)
            sm = next((m for m in by_variant.get(s, []) if m.config["round"] == r and not m.error), None)
            if am and sm and am.wall_s and sm.wall_s:
                ratios.append(am.wall_s / sm.wall_s)
                orders.append(am.config["order"])
                if am.client_cpu_s and sm.client_cpu_s:
                    cpu_ratios.append(am.client_cpu_s / sm.client_cpu_s)
        claim: dict[str, Any] = {"test": test, "aiomysql": a, "sync": s, "post": expected, "ratios": ratios,
                                 "orders": orders, "cpu_ratios": cpu_ratios}  # fmt: skip
        if ratios:
            claim.update(
                median=statistics.median(ratios),
                min=min(ratios),
                max=max(ratios),
                sync_faster_rounds=sum(r > 1 for r in ratios),
                cpu_median=statistics.median(cpu_ratios) if cpu_ratios else None,
                cpu_min=min(cpu_ratios, default=None),
                cpu_max=max(cpu_ratios, default=None),
            )
        out["claims"].append(claim)
    check = next((m for m in rows if m.config.get("variant") == "check"), None)
    out["check"] = check.extra if check else None
    return out


def verdict(claim: dict[str, Any]) -> str:
    """Plain words for a claim's per-round ratios (aiomysql time / sync time: above 1, sync was faster)."""
    ratios = claim.get("ratios") or []
    if not ratios:
        return "not measured"
    k, n = claim["sync_faster_rounds"], len(ratios)
    if k == n:
        return f"sync faster in every round ({k} of {n})"
    if k == 0:
        return f"aiomysql faster in every round ({n} of {n})"
    if k >= 0.8 * n:
        return f"sync faster in {k} of {n} rounds"
    if k <= 0.2 * n:
        return f"aiomysql faster in {n - k} of {n} rounds"
    return f"no consistent winner: sync faster in {k} of {n} rounds"


def _ms(value: float | None) -> str:
    return fmt(value, digits=1)


def _cpu(claim: dict[str, Any]) -> str:
    if claim.get("cpu_median") is None:
        return "-"
    return f"{claim['cpu_median']:.2f} ({claim['cpu_min']:.2f}-{claim['cpu_max']:.2f})"


def _few(values: list[Any]) -> str:
    return ", ".join("-" if x is None else str(x) for x in values) or "-"


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The report's post-002 section: the variants, the post's claims checked, and the answer."""
    s = summary(rows)
    rounds = max((v["rounds"] for v in s["variants"].values()), default=0)
    out = [f"## Post 002: sync SQLAlchemy against aiomysql ({LOOP} inserts, {rounds} rounds)", ""]
    header = ["test", "variant", "driver", "ms per 100 inserts, median", "min-max", "inserts/s",
              "client CPU ms/insert", "p99 ms/insert", "connections opened", "rows committed", "@@autocommit",
              "notes"]  # fmt: skip
    out += [row(header), "| --- | --- | --- |" + " ---: |" * 8 + " --- |"]
    for v in s["variants"].values():
        spread = f"{_ms(v['wall_ms_min'])}-{_ms(v['wall_ms_max'])}" if v["rounds"] else "-"
        cells = [
            v["test"] or "",
            v["label"],
            v["driver"] or "",
            _ms(v["wall_ms_median"]),
            spread,
            fmt(v["inserts_per_s_median"], digits=0),
            fmt(v["cpu_ms_per_insert_median"], digits=3),
            _ms(v["p99_ms_median"]),
            _few(v["connections_opened"]),
            _few(v["rows_committed"]),
            _few(v["autocommit"]),
            "; ".join(e[:80] for e in v["errors"]),
        ]
        out.append(row(cells))
    out += ["", "What each variant runs:", ""]
    out += [f"- {v['label']}: {v['what']}" for v in s["variants"].values()]
    out += [
        "",
        "The post's claims, round by round (time of the aiomysql variant / time of the sync one in the same "
        "round; above 1, sync was faster; F: the round ran forward, R: reversed):",
        "",
        "| test | aiomysql / sync | the post | median | min-max | per-round ratios (order) "
        "| client CPU ratio, median (min-max) | here |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | --- |",
    ]
    for c in s["claims"]:
        label_a = s["variants"].get(c["aiomysql"], {}).get("label", c["aiomysql"])
        label_s = s["variants"].get(c["sync"], {}).get("label", c["sync"])
        if c["ratios"]:
            per_round = ", ".join(
                f"{r:.2f} ({o[0].upper()})" for r, o in zip(c["ratios"], c["orders"], strict=True)
            )
            spread = f"{c['min']:.2f}-{c['max']:.2f}"
            cells = [c["test"], f"{label_a} / {label_s}", c["post"], f"{c['median']:.2f}", spread, per_round]
            cells += [_cpu(c), verdict(c)]
        else:
            cells = [c["test"], f"{label_a} / {label_s}", c["post"], "-", "-", "-", "-", "not measured"]
        out.append(row(cells))
    out += ["", *answer(s), ""]
    return out, s


def answer(s: dict[str, Any]) -> list[str]:
    """The plain answer to the post's question, and what the check of the default pool found."""
    lines = []
    tx = next((c for c in s["claims"] if c["aiomysql"] == "aiomysql-tx" and c["sync"] == "sa-tx"), None)
    if tx and tx["ratios"]:
        sync_label = s["variants"]["sa-tx"]["label"]
        a, b = s["variants"]["aiomysql-tx"]["wall_ms_median"], s["variants"]["sa-tx"]["wall_ms_median"]
        beats = tx["sync_faster_rounds"] >= 0.8 * len(tx["ratios"])
        loses = tx["sync_faster_rounds"] <= 0.2 * len(tx["ratios"])
        word = "Yes" if beats else ("No" if loses else "Not consistently")
        lines.append(
            f"**Does sync beat aiomysql with transactions here? {word}.** {sync_label} took {_ms(b)} ms "
            f"(median) for {LOOP} inserts in transactions, the aiomysql pool {_ms(a)} ms: aiomysql / sync "
            f"{tx['median']:.2f} (median of {rounds(len(tx['ratios']))}, min {tx['min']:.2f}, "
            f"max {tx['max']:.2f}); {verdict(tx)}.  In this process's CPU time per insert, which depends "
            f"less on the server's fsyncs and the machine's load, aiomysql / sync was {_cpu(tx)}."
        )
    check = s.get("check")
    if check:
        if check.get("blocked_at"):
            lines.append(
                f"With aiomysql's default pool (maxsize={check['maxsize']}) the post's \"pool not returned\" "
                f"loop did {check['inserts_done']} inserts; the {check['blocked_at']}th acquire() was still "
                "waiting "
                f"after {check['waited_s']:.0f} s and was given up: as written, that loop never ends.  The "
                'timed "not returned" variants use maxsize=200.'
            )
        else:
            lines.append(f'With aiomysql\'s default pool the "not returned" loop finished: {check}.')
    return lines


def chart(path: Path, rows: list[Measurement]) -> Path | None:
    """Each variant's time per 100 inserts in every round (dots) and its median (a bar), log scale."""
    runs = [m for m in rows if m.config.get("variant") not in (None, "check") and not m.error and m.wall_s]
    if not runs:
        return None
    labels = list(dict.fromkeys(m.label for m in runs))
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(labels) + 1.8))
    for y, label in enumerate(labels):
        times = [(m.wall_s or 0) * 1e3 for m in runs if m.label == label]
        test = next(m.config.get("test") for m in runs if m.label == label)
        color = {"autocommit off": "C0", "autocommit on": "C1", "transactions": "C2"}.get(str(test), "C3")
        ax.scatter(times, [y] * len(times), s=14, alpha=0.6, color=color)
        ax.plot([statistics.median(times)] * 2, [y - 0.35, y + 0.35], color=color, linewidth=2.5)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"ms per {LOOP} inserts (dots: rounds; bar: median); log scale")
    ax.set_title("Post 002: sync SQLAlchemy against aiomysql, and boundeddb's runners, on the same inserts")
    ax.grid(alpha=0.3, axis="x", which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
