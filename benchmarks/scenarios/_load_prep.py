"""
The ``load`` scenario's row preparation (:mod:`.load`): the time ``load()`` spends turning the rows
into chunks of records, its chunk units built from the rows alone (no database), against the time a
hand-written loop spends turning them into tuples; the report sets it against the whole load's.
"""

from __future__ import annotations

import time

from sqlalchemy.ext.asyncio import async_sessionmaker

from boundeddb import SemaphoreRunner

from ..harness import Context
from ._load_hand import _chunks
from ._load_rows import BATCH, Input
from ._load_sides import GROUP


async def measure_prep(ctx: Context, work: Input, round_no: int, rounds: int) -> None:
    """
    The time ``load()`` spends turning the rows into chunks of records, without the database: its
    chunk units built from the rows (boundeddb's ``LoadCall``, as ``load()`` builds them), and a
    hand-written loop's records (``itemgetter``) for comparison.
    """
    from boundeddb._loads.call import LoadCall

    label = f"load {work.workload} asyncpg prep" + (f" round {round_no}" if rounds > 1 else "")
    engine = ctx.db.async_engine(ctx.app_name(label), pool_size=1)
    try:
        runner = SemaphoreRunner(async_sessionmaker(engine), limit=1)
        call = LoadCall(
            runner._engine,
            runner._dialect,
            work.target,
            work.rows,
            columns=None,
            batch=BATCH,
            errors="collect",
            journal=None,
            async_units=True,
        )
        cpu0, t0 = time.process_time(), time.perf_counter()
        units = call.units()
        chunks = sum(1 for _ in units)  # type: ignore[union-attr]
        prep_s, prep_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        t0 = time.perf_counter()
        for chunk in _chunks(work.rows, BATCH):
            work.records(chunk)
        hand_s = time.perf_counter() - t0
    finally:
        await engine.dispose()
    from ..measurement import Measurement

    m = Measurement(
        GROUP,
        label,
        group=GROUP,
        schema=ctx.schema,
        n=len(work.rows),
        succeeded=len(work.rows),
        wall_s=prep_s,
        client_cpu_s=prep_cpu,
        ops_per_s=len(work.rows) / prep_s if prep_s else None,
        config={
            "database": "postgresql",
            "driver": "asyncpg",
            "kind": "prep",
            "workload": work.workload,
            "batch": BATCH,
            "rows_in": len(work.rows),
            "round": round_no,
        },
    )
    m.extra.update(chunks=chunks, hand_records_s=hand_s)
    ctx.results.append(m)
    ctx.log(
        f"  {label}: chunks of records from {len(work.rows):,} rows in {prep_s:.2f} s "
        f"(a hand loop's tuples: {hand_s:.2f} s)"
    )
