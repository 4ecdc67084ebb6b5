"""
``instructions``: the overhead pairs counted in CPU instructions per op, under callgrind.

On a shared 2-core machine one round of ``overhead`` swings by ±10% and an A/A comparison
(hand-written against itself, blocks interleaved in one process) by ±4%: the median of 9 rounds
cannot resolve the 3% target with confidence.  The client's work per op can be counted instead.
Each side of each ``overhead`` pair (the same code, the same op sequence) runs in a child process
under ``valgrind --tool=callgrind`` twice, with ``SMALL`` and ``LARGE`` ops; the difference of the
two totals divided by ``LARGE - SMALL`` is the instructions one op costs in the client (the
interpreter, SQLAlchemy, the driver, the runner; start-up and per-run costs cancel out).  Two runs
of the same side agree within about 1%.

What it does not see: time in the kernel (the sides make the same system calls per op, counted
with ``strace -c``) and stalls (cache misses, which only wall-clock rounds show).  Work that depends
on wall time is inflated ~50x under valgrind — the library's 5 ms loop-lag ticker included — so the
library's count is, if anything, too high.  The sampler thread of the other scenarios is off here.

The ratio reported is hand-written / library instructions per op: at least 0.97 means the library
costs at most 3% more client work per op (the batch pairs' target, issue #33's, is 0.95: at most 5%;
a batch pair's op is one of the 50 a transaction holds, so its per-op count carries a fiftieth of the
batch's session, transaction and COMMIT).  Where a pair has an instrumented peer (the library side
under ``boundeddb.instrument()``), it is counted too, and reported as instrumented / library (the
goal: at most 1.10).  Skipped, with a note, where valgrind is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from .. import workers
from ..db.postgresql import ENV_VAR
from ..harness import Context
from ..measurement import Measurement, error_line
from ..scenario import Scenario
from . import overhead

GROUP = "instructions"
SMALL, LARGE = 200, 800
#: A side under callgrind runs ~50x slower: stop a child that hangs.
CHILD_TIMEOUT_S = 1800
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _child_env(ctx: Context) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_VAR] = ctx.db.url.render_as_string(hide_password=False)
    return env


def count(ctx: Context, pair: str, side: str, n: int) -> int:
    """Instructions of a child process that runs ``side`` of ``pair`` once on ``n`` ops."""
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        *workers.command("instructions", pair, side, str(n)),
        "--seed", str(ctx.seed), "--limit", str(ctx.limit),
    ]  # fmt: skip
    if ctx.index:
        command.append("--index")
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=_child_env(ctx),
        cwd=workers.ROOT,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"callgrind child exited with {done.returncode}: {tail[:200]}")
    return int(found.group(1))


def counted(pair: overhead.Pair) -> tuple[overhead.Side, ...]:
    """The sides of ``pair`` counted: the library, its hand-written equivalent, the library instrumented."""
    return (pair.library, pair.hand, *(p for p in pair.peers if p.key == overhead.INSTRUMENTED))


def run(ctx: Context) -> None:
    if shutil.which("valgrind") is None:
        ctx.log("instructions: skipped, valgrind is not installed (apt-get install valgrind)")
        ctx.results.append(
            Measurement(GROUP, "instructions", group=GROUP, schema=ctx.schema, error="valgrind not installed")
        )
        return
    for pair in overhead.PAIRS.values():
        if pair.name not in ctx.instructions_pairs if ctx.instructions_pairs else not pair.counted:
            continue
        for side in counted(pair):
            label = f"{side.name} (L={side.limit or ctx.limit}) instructions"
            m = Measurement(side.name, label, group=GROUP, schema=ctx.schema, n=LARGE - SMALL)
            m.config.update(pair=pair.name, side=side.key, small=SMALL, large=LARGE)
            try:
                small, large = count(ctx, pair.name, side.key, SMALL), count(ctx, pair.name, side.key, LARGE)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                m.error = error_line(exc)
                ctx.log(f"{label}: FAILED: {m.error}")
            else:
                m.extra.update(instructions_small=small, instructions_large=large)
                m.extra["instructions_per_op"] = (large - small) / (LARGE - SMALL)
                ctx.log(f"{label}: {m.extra['instructions_per_op'] / 1e6:.3f} M instructions per op")
            ctx.results.append(m)


SCENARIO = Scenario(
    name="instructions",
    run=run,
    what="the overhead pairs in CPU instructions per op under callgrind (valgrind; ~8 min per pair)",
    section="Instructions per op (callgrind)",
    seconds=2800,
    index_pass=True,
    default=False,
)
