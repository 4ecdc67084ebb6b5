"""
One side of an overhead pair, run once for the ``instructions`` scenario, under callgrind.

``python -m benchmarks.workers.instructions PAIR SIDE N [--seed S] [--limit L] [--index]`` runs
side SIDE (``library``, ``hand-written``, ``instrumented`` or another peer's key) of overhead pair
PAIR on the first N ops of the sequence, on the database named by ``$BOUNDEDDB_BENCH_URL``, with no
sampler thread and nothing printed; it exits 1 if the side failed.
:mod:`benchmarks.scenarios.instructions` starts it under ``valgrind --tool=callgrind`` and reads the
instruction count valgrind prints.
"""

from __future__ import annotations

import argparse
import sys

from ..db.postgresql import resolve
from ..harness import Context
from ..scenarios import overhead
from ..scenarios.instructions import GROUP
from ..workload import make_ops


def main(argv: list[str]) -> int:
    """Run one side once: no sampler, nothing printed; 1 if it failed."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.workers.instructions")
    p.add_argument("pair", choices=list(overhead.PAIRS))
    sides = sorted({side.key for pair in overhead.PAIRS.values() for side in pair.sides})
    p.add_argument("side", choices=sides)
    p.add_argument("n", type=int)
    p.add_argument("--seed", type=int, default=2022)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--index", action="store_true")
    args = p.parse_args(argv)
    pair = overhead.PAIRS[args.pair]
    side = next((s for s in pair.sides if s.key == args.side), None)
    if side is None:
        p.error(f"pair {args.pair} has no side {args.side}")
    ctx = Context(
        db=resolve(),
        ops=make_ops(args.n, args.seed),
        seed=args.seed,
        limit=args.limit,
        sweep_n=0,
        memory_units=0,
        loop_lag_requests=0,
        index=args.index,
        sampling=False,
    )
    side.run(ctx, ctx.ops, GROUP, f"{side.name} instructions")
    failed = [m for m in ctx.results if m.error or m.failed]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
