"""
How much a randomized test tries: a quick version in the suite, the long one in ``nox -s soak``.

``BOUNDEDDB_SOAK=N`` (the soak session sets it) runs every collected test N times (tests/conftest.py)
and gives the randomized tests (random cancellation points, kill points, kill storms) their long
versions, with other seeds in each round: the suite's quick version is a fixed sample of the
soak's draws, replayable by its seed.
"""

from __future__ import annotations

import os
import random

import pytest

__all__ = ["quick_or_long", "soak_rounds", "soak_seed", "soaking"]


def soak_rounds() -> int:
    """``BOUNDEDDB_SOAK``'s rounds: 1 outside a soak."""
    value = os.environ.get("BOUNDEDDB_SOAK", "").strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        msg = f"BOUNDEDDB_SOAK={value!r}: give a number of rounds, e.g. BOUNDEDDB_SOAK=30"
        raise pytest.UsageError(msg)
    return int(value)


def soaking() -> bool:
    """Whether this is a soak (``BOUNDEDDB_SOAK`` set): the randomized tests run their long versions."""
    return bool(os.environ.get("BOUNDEDDB_SOAK", "").strip())


def quick_or_long(quick: int, long: int) -> int:
    """``quick`` in the suite, ``long`` in a soak."""
    return long if soaking() else quick


def soak_seed(suite_seed: int) -> int:
    """
    A randomized test's seed: ``suite_seed`` in the suite; in a soak, a new one in each run, printed
    (``BOUNDEDDB_SEED=...`` replays it).
    """
    if not soaking():
        return suite_seed
    seed = int(os.environ.get("BOUNDEDDB_SEED") or random.randrange(2**32))
    print(f"BOUNDEDDB_SEED={seed}")
    return seed
