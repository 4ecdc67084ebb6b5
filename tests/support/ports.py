"""
TCP ports for the servers a test starts (PgBouncer, uvicorn), each pytest-xdist worker from a range of
its own.

A port that a test gives to another process cannot be held open until that process binds it (as the
proxies do with port 0), so two workers asking the kernel for "a free port" at the same moment may be
told the same one. Each worker takes its ports from its own block of ``BLOCK`` below the kernel's
ephemeral range (where the kernel never hands out ports by itself), skipping any that is in use.
"""

from __future__ import annotations

import itertools
import os
import socket

__all__ = ["free_port"]

#: The first port of worker gw0's block; the main process (no xdist) takes the block after the last.
FIRST = 20000
#: Ports per worker: 20000-20499 for gw0, 20500-20999 for gw1, ... (up to 24 workers below 32768).
BLOCK = 500


def _worker_index() -> int:
    """0 for gw0, 1 for gw1, ... (modulo 24); 24 for a run without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) % 24 if worker.startswith("gw") else 24


_block = FIRST + _worker_index() * BLOCK
_next = itertools.cycle(range(_block, _block + BLOCK))


def free_port() -> int:
    """A port of this worker's block that nothing listens on or holds now (the next one, in turn)."""
    for _ in range(BLOCK):
        port = next(_next)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    msg = f"no free port in this worker's block {_block}-{_block + BLOCK - 1}"
    raise RuntimeError(msg)
