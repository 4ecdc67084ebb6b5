"""The report's "Instructions per op" section and its targets (the scenario: ``instructions``)."""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios.instructions import GROUP, LARGE, SMALL
from ..scenarios.overhead import HAND_WRITTEN, INSTRUMENTED, INSTRUMENTED_GOAL, LIBRARY, PAIRS
from ..scenarios.parity import ROWS_PER_OP
from .tables import verdict


def summary(rows: list[Measurement], schema: str) -> dict[str, dict[str, Any]]:
    """Per pair: instructions per op of each side, hand-written / library and instrumented / library."""
    out: dict[str, dict[str, Any]] = {}
    per_op = {
        (m.config.get("pair"), m.config.get("side")): m.extra.get("instructions_per_op")
        for m in rows
        if m.group == GROUP and m.schema == schema and not m.error
    }
    for pair in PAIRS.values():
        lib, hand = per_op.get((pair.name, LIBRARY)), per_op.get((pair.name, HAND_WRITTEN))
        instrumented = per_op.get((pair.name, INSTRUMENTED))
        if lib is None and hand is None:
            continue
        out[pair.name] = {
            "ratio_name": pair.ratio_name,
            "target": pair.target,
            "library_per_op": lib,
            "hand_written_per_op": hand,
            "ratio": hand / lib if lib and hand else None,
            "instrumented_per_op": instrumented,
            "instrumented_ratio": instrumented / lib if lib and instrumented else None,
        }
    return out


def _m(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.3f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The report's Markdown lines for this scenario, and its data."""
    skipped = [m for m in rows if m.group == GROUP and m.label == "instructions" and m.error]
    if skipped:
        return ["## Instructions per op (callgrind)", "", f"Skipped: {skipped[0].error}.", ""], {}
    lines = [
        "## Instructions per op (callgrind)",
        "",
        "| pair | schema | library M instr/op | hand-written M instr/op | hand-written / library | target "
        "| instrumented M instr/op | instrumented / library | goal |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    data: dict[str, Any] = {}
    for schema in ("faithful", "index"):
        s = summary(rows, schema)
        if s:
            data[schema] = s
        for p in s.values():
            cost = p["instrumented_ratio"]
            shown = verdict(cost, INSTRUMENTED_GOAL, at_most=True)
            goal = "-" if cost is None else f"{shown} (<= {INSTRUMENTED_GOAL})"
            lines.append(
                f"| {p['ratio_name']} | {schema} | {_m(p['library_per_op'])} | "
                f"{_m(p['hand_written_per_op'])} | "
                f"{_x(p['ratio'])} | {verdict(p['ratio'], p['target'])} (>= {p['target']}) | "
                f"{_m(p['instrumented_per_op'])} | {_x(cost)} | {goal} |"
            )
    lines += [
        "",
        f"Each side ran in a child process under `valgrind --tool=callgrind`, on {SMALL:,} and on "
        f"{LARGE:,} ops of the same sequence; instructions per op = (total at {LARGE:,} - total at "
        f"{SMALL:,}) / {LARGE - SMALL:,}, so start-up and per-run costs cancel.  Repeatable within "
        "about 1%, unlike the wall-clock rounds above; blind to kernel time and cache stalls.  Work "
        "that depends on wall time (the library's 5 ms loop-lag ticker) is inflated ~50x under "
        "valgrind and counted against the library.  Instrumented: the library side under "
        "`boundeddb.instrument()` with the OpenTelemetry SDK (spans batched to an exporter that drops "
        "them, metrics to an in-memory reader): what metrics and traces cost per op when asked for.",
        "",
    ]
    batches = [PAIRS[n] for s in data.values() for n in s if "batch" in PAIRS[n].library.options]
    if batches:
        sizes = " or ".join(str(b) for b in dict.fromkeys(p.library.options["batch"] for p in batches))
        lines += [
            f"In the batch pairs a transaction holds {sizes} units on both sides, so an op's count carries "
            f"its share of its batch's session, BEGIN and COMMIT; in the log-row pairs an op is "
            f"{ROWS_PER_OP} units, each one request-log row.",
            "",
        ]
    return lines, data


def targets(data: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per pair and schema counted: hand-written / library, and instrumented / library where counted."""
    out = []
    for schema, pairs in data.items():
        for name, p in pairs.items():
            ratio = p["ratio"]
            pair, target = PAIRS[name], p["target"]
            out.append(
                {
                    "target": f"client work per op of {pair.subject} within {1 - target:.0%} of "
                    f"{pair.yardstick} (instructions, hand-written / library >= {target}): "
                    f"{p['ratio_name']}, {schema}",
                    "value": ratio,
                    "status": verdict(ratio, target),
                    "shown": "-" if ratio is None else f"{ratio:.4f}",
                    "pair": name,
                    "schema": schema,
                }
            )
            if (cost := p.get("instrumented_ratio")) is not None:
                out.append(
                    {
                        "target": f"metrics and traces cost at most {INSTRUMENTED_GOAL - 1:.0%} more client "
                        f"work per op (instructions, instrumented / library <= {INSTRUMENTED_GOAL}): "
                        f"{p['ratio_name']}, {schema}",
                        "value": cost,
                        "status": verdict(cost, INSTRUMENTED_GOAL, at_most=True),
                        "shown": f"{cost:.4f}",
                        "pair": name,
                        "schema": schema,
                    }
                )
    return out
