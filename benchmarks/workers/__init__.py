"""
Code that runs in a child process of the suite, one module per kind of child.

``fleet`` (one process of the fleet scenario), ``gevent_pool`` (the gevent row, monkey-patched
away from the suite's process), ``instructions`` (one overhead side under callgrind), ``loadgen``
(the loop-lag and post-004 load generators and pinger) and ``neighbour`` (the auto-limit
scenario's noisy neighbour).  Each is started with :func:`command`, talks over its standard
input and output, and imports nothing it does not need.  ``processes`` is not a command: it holds
the functions that the processes scenario's spawned workers (ProcessRunner's, a
``ProcessPoolExecutor``'s, Dask's) import by name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: The repository root: the children's working directory, where ``benchmarks`` is importable.
ROOT = Path(__file__).resolve().parents[2]


def command(worker: str, *args: str) -> list[str]:
    """The command line that runs ``benchmarks.workers.<worker>`` with ``args`` in this interpreter."""
    return [sys.executable, "-m", f"{__name__}.{worker}", *args]


def start(worker: str, *args: str) -> subprocess.Popen[str]:
    """Start ``worker`` with ``args`` in the repository root, its standard streams piped as text."""
    return subprocess.Popen(
        command(worker, *args),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
