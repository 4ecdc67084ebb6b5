"""
The processes section's model of bigger hosts: how far throughput grows with client cores.

From the ProcessRunner sides' client CPU per op (fitted over 1, 2 and 4 processes) and their
backends' server CPU per op, :func:`model` gives the client-bound ops/s of a host of more cores,
the server cores they need and where one server saturates; :func:`model_lines` writes it with its
assumptions.
"""

from __future__ import annotations

from typing import Any

from .tables import fmt, table

#: The model's client cores and server cores.
MODEL_CORES = (4, 8, 16)
SERVER_CORES = (4, 8, 16)
PROCESS_SIDES = ("process-1", "process-2", "process-4")


def _fit(sides: dict[str, dict[str, Any]], n: int) -> tuple[float | None, float | None]:
    """
    Client CPU-s of ProcessRunner(P) as ``a * P + c * N`` (least squares over P = 1, 2, 4): the
    start-up CPU of a worker ``a`` and the CPU per unit ``c`` (seconds); ``(None, None)`` if it does not fit.
    """
    points = [
        (sides[key]["processes"], sides[key]["client_cpu_s"])
        for key in PROCESS_SIDES
        if key in sides and sides[key]["client_cpu_s"]
    ]
    if len(points) < 2 or not n:
        return None, None
    mean_p = sum(p for p, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((p - mean_p) ** 2 for p, _ in points)
    slope = sum((p - mean_p) * (y - mean_y) for p, y in points) / spread
    intercept = mean_y - slope * mean_p
    return (slope, intercept / n) if intercept > 0 and slope >= 0 else (None, None)


def model(sides: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The bigger-host model from the ProcessRunner sides (see :func:`model_lines` for its assumptions)."""
    two = sides.get("process-2")
    if not two or not two["server_ms_per_op"] or not two["parent_ms_per_op"]:
        return None
    startup_cpu, per_unit = _fit(sides, two["n"])
    fitted = per_unit is not None
    c = per_unit if per_unit is not None else (two["client_ms_per_op"] or 0.0) / 1e3
    s, p = two["server_ms_per_op"] / 1e3, two["parent_ms_per_op"] / 1e3
    if c <= 0:
        return None
    return {
        "client_cpu_ms_per_op": c * 1e3,
        "fitted": fitted,
        "startup_cpu_s_per_worker": startup_cpu,
        "server_cpu_ms_per_op": s * 1e3,
        "parent_cpu_ms_per_op": p * 1e3,
        "parent_ceiling_ops_s": 1 / p,
        "this_machine_ops_s": (two["steady_ops_per_s"], 2 / (c + s)),
        "cores": [
            {"cores": k, "ops_s": k / c, "server_cores": k / c * s, "parent_cores": k / c * p}
            for k in MODEL_CORES
        ],
        "servers": [{"server_cores": k, "ops_s": k / s, "client_cores": k * c / s} for k in SERVER_CORES],
    }


def model_lines(schema: str, m: dict[str, Any] | None) -> list[str]:
    """The model's table and its assumptions, for one schema."""
    if m is None:
        return [f"No model for the {schema} schema: the ProcessRunner sides did not all run.", ""]
    how = (
        f"fitted over ProcessRunner(1, 2, 4): client CPU-s = {m['startup_cpu_s_per_worker']:.2f} s per "
        "worker (its start-up) + c x N"
        if m["fitted"]
        else "ProcessRunner(2)'s client CPU per op, start-up included (the fit over 1, 2, 4 did not hold)"
    )
    steady, predicted = m["this_machine_ops_s"]
    out = [
        f"Beyond this machine ({schema} schema): client CPU per op c = {m['client_cpu_ms_per_op']:.2f} ms "
        f"({how}); server CPU per op s = {m['server_cpu_ms_per_op']:.2f} ms (ProcessRunner(2)'s backends); "
        f"the parent process's share p <= {m['parent_cpu_ms_per_op']:.3f} ms per op (an upper bound: "
        "it includes starting the workers, and the probe's sampler and loop-lag ticker, which run there).",
        "",
        *table(
            [
                "client cores (one worker each)",
                "client-bound ops/s = cores / c",
                "server cores needed = ops/s x s",
                "parent's cores <= ops/s x p",
            ],
            [
                [
                    str(k["cores"]),
                    fmt(k["ops_s"], digits=0),
                    fmt(k["server_cores"], digits=1),
                    fmt(k["parent_cores"], digits=2),
                ]
                for k in m["cores"]
            ],
        ),
        "",
        "A server of S cores saturates at S / s ops/s, which takes S x c / s client cores: "
        + "; ".join(
            f"S={k['server_cores']}: {k['ops_s']:,.0f} ops/s with {k['client_cores']:.1f} client cores"
            for k in m["servers"]
        )
        + ".  One parent process hands out units to all the workers: it caps a runner at 1 / p, at least "
        f"{m['parent_ceiling_ops_s']:,.0f} ops/s.",
        "",
        "The model assumes: every worker process has a core of its own and spends c per op whatever "
        "their number (no shared cache or memory-bandwidth limit, no lock contention); the limit grows "
        "with the workers, so each keeps its connections busy; the server spends s per op whatever the "
        "load and the tables' size (true on the indexed schema; without the index each read scans b, "
        "which grows), and only in the measured backends (WAL writer, checkpoints, fsync waits and the "
        "network are left out); client and server on separate hosts, and the network not the limit.  "
        f"On this machine, where client and server share 2 cores, it predicts 2 / (c + s) = "
        f"{predicted:,.0f} ops/s without start-up; ProcessRunner(2) measured {fmt(steady, digits=0)} "
        "ops/s from its first unit to `map()`'s return (other work on the machine takes its share of "
        "the cores).",
        "",
    ]
    return out
