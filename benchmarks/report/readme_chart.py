"""
The README's throughput chart: the throughput rows of the 35,000-operation reference run, with the
``batch=50`` row of the run that added it beside ``semaphore`` (the median of its 3 rounds).

``python -m benchmarks.report.readme_chart`` writes ``docs/_static/bench/throughput.png`` from the two
runs' committed ``results.json``; nothing is measured.
"""

from __future__ import annotations

from pathlib import Path

from ..measurement import Measurement
from . import charts
from .files import read_results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
#: The run the README's table quotes, and the later run with ``SemaphoreRunner(limit=20, batch=50)``.
BASE, BATCHES = RESULTS / "reference-n35000", RESULTS / "reference-n35000-batch50"
OUT = ROOT / "docs" / "_static" / "bench" / "throughput.png"
#: The row the batch rows follow in the chart.
AFTER = "semaphore (L=20)"


def rows() -> list[Measurement]:
    """The base run's throughput rows, each batch scenario's median round placed after :data:`AFTER`."""
    base = [m for m in read_results(BASE)[1] if m.group == "main"]
    later = [m for m in read_results(BATCHES)[1] if m.group == "main" and "batch" in m.scenario]
    medians = []
    for scenario in dict.fromkeys(m.scenario for m in later):
        rounds = sorted((m for m in later if m.scenario == scenario), key=lambda m: m.ops_per_s or 0.0)
        medians.append(rounds[len(rounds) // 2])
    at = next(i for i, m in enumerate(base) if m.label == AFTER) + 1
    return [*base[:at], *medians, *base[at:]]


def main() -> None:
    path = charts.throughput(OUT, rows())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
