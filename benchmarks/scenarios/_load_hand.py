"""
The ``load`` scenario's hand-written bulk loops (:mod:`.load`): what a developer writes without
boundeddb, on the same driver and connections as ``load()``, each taking chunks of :data:`BATCH` rows.

* asyncpg: :data:`LIMIT` coroutines take chunks of records (tuples, turned from the dicts as it
  goes) from a queue, each chunk ``copy_records_to_table()`` on a pooled connection in a
  transaction of its own; for duplicates, each chunk ``COPY``'d into a temporary staging table and
  moved with ``INSERT ... ON CONFLICT DO NOTHING`` (the duplicates dropped, not reported).
* psycopg 3: :data:`LIMIT` threads taking chunks from one iterator, each ``cursor.copy()``
  ``write_row()`` a record at a time.
* aiomysql: :data:`LIMIT` coroutines, each chunk one ``cursor.executemany()`` (aiomysql sends it as
  multi-row ``INSERT`` statements) and a commit.
* pysqlite: one thread, each chunk ``cursor.executemany()`` and a commit, or multi-row ``INSERT``
  statements of :data:`HAND_VALUES` rows, as ``load()`` sends them.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from ..db.schema import SCHEMA
from ..harness import Probe
from ._load_rows import BATCH, LIMIT, Input

#: Rows a statement of the hand-written multi-row INSERT loop on SQLite: load()'s own size.
HAND_VALUES = 1000


def _chunks(rows: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


async def hand_copy_asyncpg(engine: AsyncEngine, work: Input, p: Probe, *, staging: bool = False) -> int:
    """
    8 coroutines taking chunks of records from a queue, each ``copy_records_to_table()`` in a
    transaction of its own on a pooled connection; with ``staging``, into a temporary table, then
    ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``.  Returns the rows inserted.
    """
    queue: asyncio.Queue[list[tuple[Any, ...]] | None] = asyncio.Queue(maxsize=2 * LIMIT)
    columns = list(work.columns)
    shown = ", ".join(columns)
    inserted = [0]

    async def produce() -> None:
        for chunk in _chunks(work.rows, BATCH):
            await queue.put(work.records(chunk))
        for _ in range(LIMIT):
            await queue.put(None)

    async def consume() -> None:
        while (records := await queue.get()) is not None:
            async with engine.connect() as conn:
                raw: Any = (await conn.get_raw_connection()).driver_connection
                async with raw.transaction():
                    if staging:
                        await raw.execute(
                            f"CREATE TEMP TABLE IF NOT EXISTS load_stage (LIKE {SCHEMA}.{work.table} "
                            "INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
                        )
                        await raw.copy_records_to_table("load_stage", records=records, columns=columns)
                        status = await raw.execute(
                            f"INSERT INTO {SCHEMA}.{work.table} ({shown}) SELECT {shown} FROM load_stage "
                            "ON CONFLICT DO NOTHING"
                        )
                        inserted[0] += int(status.rsplit(" ", 1)[-1])
                    else:
                        await raw.copy_records_to_table(
                            work.table, records=records, columns=columns, schema_name=SCHEMA
                        )
                        inserted[0] += len(records)
            p.done += len(records)

    await asyncio.gather(produce(), *(consume() for _ in range(LIMIT)))
    return inserted[0]


def _threads(n: int, worker: Callable[[], None]) -> None:
    with ThreadPoolExecutor(n, thread_name_prefix="hand-load") as pool:
        for future in [pool.submit(worker) for _ in range(n)]:
            future.result()


def hand_copy_psycopg(engine: Engine, work: Input, p: Probe) -> int:
    """8 threads taking chunks from one iterator, each ``cursor.copy()`` a record at a time, and a commit."""
    chunks, lock = _chunks(work.rows, BATCH), threading.Lock()
    statement = f"COPY {SCHEMA}.{work.table} ({', '.join(work.columns)}) FROM STDIN"

    def worker() -> None:
        while True:
            with lock:
                chunk = next(chunks, None)
                if chunk is None:
                    return
                records = work.records(chunk)
            with engine.connect() as conn:
                driver: Any = conn.connection.driver_connection
                with driver.cursor() as cursor, cursor.copy(statement) as copy:
                    write = copy.write_row
                    for record in records:
                        write(record)
                driver.commit()
            with lock:
                p.done += len(records)

    _threads(LIMIT, worker)
    return len(work.rows)


async def hand_insert_aiomysql(engine: AsyncEngine, work: Input, p: Probe) -> int:
    """8 coroutines, each chunk one ``cursor.executemany()`` (multi-row INSERTs) and a commit."""
    chunks = _chunks(work.rows, BATCH)
    marks = ", ".join(["%s"] * len(work.columns))
    statement = f"INSERT INTO {SCHEMA}.{work.table} ({', '.join(work.columns)}) VALUES ({marks})"

    async def worker() -> None:
        for chunk in chunks:  # one iterator: each coroutine takes the next chunk
            records = work.records(chunk)
            async with engine.connect() as conn:
                raw: Any = (await conn.get_raw_connection()).driver_connection
                async with raw.cursor() as cursor:
                    await cursor.executemany(statement, records)
                await raw.commit()
            p.done += len(records)

    await asyncio.gather(*(worker() for _ in range(LIMIT)))
    return len(work.rows)


def hand_insert_sqlite(engine: Engine, work: Input, p: Probe, *, values: int = 1) -> int:
    """
    One connection: each chunk one ``cursor.executemany()`` and a commit; or, with ``values`` rows a
    statement, ``cursor.execute()`` of multi-row ``INSERT`` statements of that many rows.
    """
    marks = f"({', '.join(['?'] * len(work.columns))})"
    head = f"INSERT INTO {SCHEMA}.{work.table} ({', '.join(work.columns)}) VALUES "
    with engine.connect() as conn:
        driver: Any = conn.connection.driver_connection
        for chunk in _chunks(work.rows, BATCH):
            records = work.records(chunk)
            cursor = driver.cursor()
            if values == 1:
                cursor.executemany(head + marks, records)
            else:
                for start in range(0, len(records), values):
                    part = records[start : start + values]
                    statement = head + ", ".join([marks] * len(part))
                    cursor.execute(statement, list(itertools.chain.from_iterable(part)))
            cursor.close()
            driver.commit()
            p.done += len(records)
    return len(work.rows)
