"""
The report's "Library overhead" section: each runner against its hand-written equivalent.

:func:`summary` turns the ``overhead`` scenario's rows into per-pair medians and per-round ratios
(:mod:`benchmarks.scenarios.overhead` says how the rounds run); :func:`section` writes the tables,
and :func:`targets` one target line per pair and schema.
"""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios.overhead import FULL_ROUNDS, GROUP, HAND_WRITTEN, LIBRARY, PAIRS, goals
from ..stats import median_of
from .tables import NOISE, fmt, rounds, table, verdict

#: The fewest rounds whose median decides a pair's target (3%, 5%): fewer are shown as not decided.
DECIDING_ROUNDS = FULL_ROUNDS


def undecidable(target: float) -> str:
    """What a target line adds when its rounds cannot decide it."""
    return (
        f"a round moves by ±{NOISE:.0%}, too much to tell {1 - target:.0%} with fewer than "
        f"{DECIDING_ROUNDS} rounds: decide it with --overhead-rounds {DECIDING_ROUNDS} or "
        "--scenario instructions"
    )


def _ok(m: Measurement | None) -> bool:
    return m is not None and not m.error and not m.failed and bool(m.ops_per_s) and bool(m.client_cpu_s)


def _cpu_per_op(m: Measurement) -> float:
    """This process's CPU seconds per op, all its threads."""
    return (m.client_cpu_s or 0.0) / max(1, m.succeeded)


def _stats(prefix: str, values: list[float]) -> dict[str, Any]:
    return {
        f"{prefix}s": values,
        f"{prefix}_median": median_of(values),
        f"{prefix}_min": min(values, default=None),
        f"{prefix}_max": max(values, default=None),
    }


def _side_ops(rows: list[Measurement], key: str) -> list[float]:
    return [m.ops_per_s or 0.0 for m in rows if _ok(m) and m.config["side"] == key]


def _side_cpu(rows: list[Measurement], key: str) -> float | None:
    """Median CPU ms per op of one side."""
    return median_of([_cpu_per_op(m) * 1e3 for m in rows if _ok(m) and m.config["side"] == key])


def summary(rows: list[Measurement], schema: str) -> dict[str, dict[str, Any]]:
    """
    Per pair: the median ops/s and CPU ms/op of each side; the per-round ratios library /
    hand-written (ops/s) and hand-written / library (CPU per op) with their median, min and max;
    and per peer the per-round ratios peer / hand-written.  Rounds where either side of a ratio
    failed are left out of it.
    """
    out: dict[str, dict[str, Any]] = {}
    rows = [m for m in rows if m.group == GROUP and m.schema == schema]
    for pair in PAIRS.values():
        mine = [m for m in rows if m.config.get("pair") == pair.name]
        if not mine:
            continue
        by_round: dict[int, dict[str, Measurement]] = {}
        for m in mine:
            by_round.setdefault(int(m.config["round"]), {})[str(m.config["side"])] = m
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        orders: list[str] = []
        peer_ratios: dict[str, list[float]] = {p.key: [] for p in pair.peers}
        for k in sorted(by_round):
            got = by_round[k]
            lib, hand = got.get(LIBRARY), got.get(HAND_WRITTEN)
            if hand is None or not _ok(hand):
                continue
            if lib is not None and _ok(lib):
                ratios.append((lib.ops_per_s or 0.0) / (hand.ops_per_s or 1.0))
                cpu_ratios.append(_cpu_per_op(hand) / _cpu_per_op(lib))
                first = int(lib.config["position"]) < int(hand.config["position"])
                orders.append("AB" if first else "BA")
            for peer in pair.peers:
                pm = got.get(peer.key)
                if pm is not None and _ok(pm):
                    peer_ratios[peer.key].append((pm.ops_per_s or 0.0) / (hand.ops_per_s or 1.0))

        out[pair.name] = {
            "pair": pair.name,
            "ratio_name": pair.ratio_name,
            "target": pair.target,
            "library": pair.library.what,
            "hand_written": pair.hand.what,
            "rounds": len(by_round),
            "n": max(m.n for m in mine),
            "limit": next((m.config["limit"] for m in mine if "limit" in m.config), None),
            "library_median_ops_s": median_of(_side_ops(mine, LIBRARY)),
            "hand_written_median_ops_s": median_of(_side_ops(mine, HAND_WRITTEN)),
            "orders": orders,
            **_stats("ratio", ratios),
            "library_cpu_ms_per_op": _side_cpu(mine, LIBRARY),
            "hand_written_cpu_ms_per_op": _side_cpu(mine, HAND_WRITTEN),
            **_stats("cpu_ratio", cpu_ratios),
            "peers": {
                peer.key: {
                    "name": peer.name,
                    "ratio_name": pair.peer_ratio_name(peer),
                    "what": peer.what,
                    "median_ops_s": median_of(_side_ops(mine, peer.key)),
                    "cpu_ms_per_op": _side_cpu(mine, peer.key),
                    **_stats("ratio", peer_ratios[peer.key]),
                }
                for peer in pair.peers
            },
            "errors": [f"{m.label}: {m.error}" for m in mine if m.error],
            "failed_units": sum(m.failed for m in mine),
            "loadavg_1m": [m.extra["loadavg_1m"] for m in mine if "loadavg_1m" in m.extra],
        }
    return out


def _range(s: dict[str, Any], prefix: str) -> str:
    low, high = s[f"{prefix}_min"], s[f"{prefix}_max"]
    return "-" if low is None else f"{low:.3f}-{high:.3f}"


def _rounds(values: list[float], orders: list[str] | None = None) -> str:
    if orders is None:
        return ", ".join(f"{r:.3f}" for r in values) or "-"
    return ", ".join(f"{r:.3f} ({o})" for r, o in zip(values, orders, strict=True)) or "-"


def tables(rows: list[Measurement]) -> tuple[list[str], list[str], dict[str, Any]]:
    """
    The overhead scenario's pairs per schema (library against hand-written), the peers' table
    (each peer against the same hand-written side), and the data behind them.
    """
    header = [
        "pair (library / hand-written)", "schema", "N", "rounds", "library median ops/s",
        "hand-written median ops/s", "ratio median", "min", "max", "per-round ratios (order)",
        "CPU ms/op, library / hand-written", "CPU ratio median (min-max)", "load avg, 1 min", "notes",
    ]  # fmt: skip
    peer_header = [
        "peer / hand-written", "schema", "peer median ops/s", "hand-written median ops/s",
        "ratio median", "min-max", "per-round ratios", "CPU ms/op, peer",
    ]  # fmt: skip
    body, peer_body, data = [], [], {}
    for schema in ("faithful", "index"):
        medians = summary(rows, schema)
        if medians:
            data[schema] = medians
        for s in medians.values():
            notes = [e.splitlines()[0][:80] for e in s["errors"]]
            if s["failed_units"]:
                notes.append(f"{s['failed_units']} units failed")
            body.append(
                [
                    s["ratio_name"],
                    schema,
                    f"{s['n']:,}",
                    str(s["rounds"]),
                    fmt(s["library_median_ops_s"], digits=0),
                    fmt(s["hand_written_median_ops_s"], digits=0),
                    fmt(s["ratio_median"], digits=3),
                    fmt(s["ratio_min"], digits=3),
                    fmt(s["ratio_max"], digits=3),
                    _rounds(s["ratios"], s["orders"]),
                    f"{fmt(s['library_cpu_ms_per_op'], digits=3)} / "
                    f"{fmt(s['hand_written_cpu_ms_per_op'], digits=3)}",
                    f"{fmt(s['cpu_ratio_median'], digits=3)} ({_range(s, 'cpu_ratio')})",
                    f"{min(load):.1f}-{max(load):.1f}" if (load := s["loadavg_1m"]) else "-",
                    "; ".join(notes),
                ]
            )
            for peer in s["peers"].values():
                peer_body.append(
                    [
                        peer["ratio_name"],
                        schema,
                        fmt(peer["median_ops_s"], digits=0),
                        fmt(s["hand_written_median_ops_s"], digits=0),
                        fmt(peer["ratio_median"], digits=3),
                        _range(peer, "ratio"),
                        _rounds(peer["ratios"]),
                        fmt(peer["cpu_ms_per_op"], digits=3),
                    ]
                )
    return table(header, body), (table(peer_header, peer_body) if peer_body else []), data


def targets(over: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One line per pair and schema: library / hand-written, median of the rounds, >= the pair's target."""
    out = []
    schemas = ["faithful", *(["index"] if "index" in over else [])]
    for schema in schemas:
        medians = over.get(schema, {})
        for pair in PAIRS.values():
            s = medians.get(pair.name)
            if s is None and pair.study != GROUP:
                continue  # a study run by name (parity): no line unless it ran
            value = s["ratio_median"] if s else None
            k = len(s["ratios"]) if s else 0
            if s and value is not None:
                shown = (
                    f"{value:.4f} (median of {rounds(k)}, "
                    f"min {fmt(s['ratio_min'], digits=3)}, max {fmt(s['ratio_max'], digits=3)}; "
                    f"CPU ratio {fmt(s['cpu_ratio_median'], digits=3)})"
                )
                if k < DECIDING_ROUNDS:
                    shown += f"; {undecidable(pair.target)}"
            else:
                shown = "no round completed" if s else "the overhead scenario did not run"
            status = verdict(value, pair.target, decided=k >= DECIDING_ROUNDS)
            out.append(
                {
                    "target": f"{pair.subject} >= {pair.target} of {pair.yardstick}: "
                    f"{pair.ratio_name}, {schema}",
                    "value": value,
                    "status": status,
                    "shown": shown,
                    "pair": pair.name,
                    "schema": schema,
                }
            )
    return out


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The section's Markdown lines, and its data: per schema, :func:`summary`."""
    pairs, peers, data = tables(rows)
    ran = dict.fromkeys(name for medians in data.values() for name in medians)
    k = max((int(m.config.get("round", 0)) for m in rows), default=0)
    out = [f"## Library overhead ({k} interleaved round{'s' if k != 1 else ''})", "", *pairs, ""]
    if peers:
        out += ["Peers, in the same rounds, against the same hand-written side:", "", *peers, ""]
    out += [
        "What each side runs (one session per op, or per batch in the batch pairs; pool_size=L, "
        "max_overflow=0):",
        "",
    ]
    for pair in PAIRS.values():
        if pair.name not in ran:
            continue
        out += [f"- {pair.name}: " + "; ".join(f"{side.name}: {side.what}" for side in pair.sides)]
    out += [
        "",
        "Each round runs every side of a pair back to back on fresh tables: library, hand-written, "
        "then the peers in rounds 1, 3, ... and the reverse order in rounds 2, 4, ..., so the library "
        "and its hand-written equivalent are neighbours, first (AB) or second (BA) in turn.  A round's "
        "ratio is library ops/s / hand-written ops/s (a peer's: peer / hand-written); the target "
        f"lines below use the median of these per-round ratios ({goals(ran)}).  The CPU ratio "
        "(hand-written CPU per op / library CPU per op, this process, all threads) is a cross-check "
        "that depends less on the machine's load (less so for threads, whose CPU time also moves with "
        "GIL contention): below 1 the library spent more client CPU per op.",
        "",
    ]
    return out, data
