"""Load: 500 concurrent submit() callers for a sustained period; 100,000 units through stream()."""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.faults import SMALL_CASES, SMALL_IDS, STALL_S, assert_no_open_transactions
from tests.support.kits import Boom, Kit
from tests.support.probes import ActivitySampler, committed_units
from tests.support.soak import quick_or_long

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


#: How long the submit soak runs: the issue asks for 60 s, which `nox -s soak` gives it; the suite 5 s.
#: BOUNDEDDB_SOAK_SECONDS chooses another.
SOAK_SECONDS = float(os.environ.get("BOUNDEDDB_SOAK_SECONDS") or quick_or_long(5, 60))
CALLERS = 500


class Soak:
    """Mixed units for the soak: select, insert (own key), short server sleep, and a failing one."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self.keys = itertools.count(100_000)
        self.inserted = 0

    def unit(self, rng: random.Random) -> tuple[str, Any]:
        kind = rng.choices(["select", "insert", "sleep", "fail"], weights=[40, 30, 20, 10])[0]
        if kind == "select":
            return kind, self.kit.select(rng.randint(0, 1000))
        if kind == "insert":
            return kind, self.kit.insert(next(self.keys))
        if kind == "sleep":
            return kind, self.kit.insert(next(self.keys), sleep=0.002)
        return kind, self.kit.insert(next(self.keys), fail=True)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize(("kind", "anyio_backend"), SMALL_CASES, ids=SMALL_IDS)
async def test_500_submit_callers_soak_within_the_limit(
    kit: Kit, admin: Engine, app_name: str, sampler: ActivitySampler
) -> None:
    """500 callers submit mixed units for BOUNDEDDB_SOAK_SECONDS: every call answered, <= 10 connections."""
    limit = 10
    runner = kit.runner(limit=limit, pool_timeout=5)
    soak = Soak(kit)
    calls = collections.Counter[str]()
    answers = collections.Counter[str]()
    surprises: list[BaseException] = []
    deadline = time.monotonic() + SOAK_SECONDS

    async def caller(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            kind, unit = soak.unit(rng)
            calls[kind] += 1
            try:
                await runner.submit(unit)
            except Boom:
                assert kind == "fail"
            except Exception as error:  # a pool timeout, say: recorded, the soak goes on
                surprises.append(error)
                continue
            answers[kind] += 1

    with sampler, anyio.fail_after(SOAK_SECONDS + 60):
        async with anyio.create_task_group() as group:
            for seed in range(CALLERS):
                group.start_soon(caller, seed)
    print(f"soak {SOAK_SECONDS:.0f} s: {sum(calls.values())} calls {dict(calls)}, peak {sampler.peak}")
    assert surprises == []
    assert answers == calls
    assert sum(calls.values()) >= CALLERS
    assert sampler.samples > 0
    assert 1 <= sampler.peak <= limit
    assert runner.in_flight == 0
    assert kit.pool.checkedout() == 0
    assert len(committed_units(admin)) == calls["insert"] + calls["sleep"]
    assert_no_open_transactions(admin, app_name, "after the soak")


STREAM_UNITS = 100_000


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(900)  # it outlasted a fixed 120 s beside two CPU hogs
@pytest.mark.parametrize(("kind", "anyio_backend"), [("semaphore", "asyncio")], ids=["semaphore-asyncio"])
async def test_100k_units_stream_with_bounded_lookahead(kit: Kit) -> None:
    """stream() over 100,000 units never pulls the generator more than ~3 * limit ahead of the consumer."""
    limit = 10
    runner = kit.runner(limit=limit)
    pulled = consumed = 0
    most_ahead = 0

    def trivial(i: int) -> Any:
        async def unit(session: AsyncSession) -> int:
            return i

        return unit

    def units() -> Iterator[Any]:
        nonlocal pulled, most_ahead
        for i in range(STREAM_UNITS):
            pulled += 1
            most_ahead = max(most_ahead, pulled - consumed)
            yield trivial(i)

    seen = 0
    with anyio.fail_after(STALL_S) as deadline:  # moved on every 1,000 outcomes: a hang, not a pace
        async with contextlib.aclosing(runner.stream(units())) as outcomes:
            async for outcome in outcomes:
                assert outcome.ok
                consumed += 1
                seen += outcome.value + 1 if outcome.value is not None else 0
                if consumed % 1000 == 0:  # dawdle now and then, so the runner runs ahead if it can
                    deadline.deadline = anyio.current_time() + STALL_S
                    for _ in range(100):
                        await anyio.lowlevel.checkpoint()
    assert consumed == STREAM_UNITS
    assert seen == STREAM_UNITS * (STREAM_UNITS + 1) // 2
    print(f"stream: most pulled ahead of the consumer = {most_ahead}")
    assert limit <= most_ahead <= 3 * limit, "the runner never ran ahead, or ran too far ahead"
