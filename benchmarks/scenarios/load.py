"""
``load``: ``runner.load(target, rows)`` (the bulk path) against hand-written bulk loops on the same
driver and connections, against ``batch=500`` ORM units and one transaction per row.

The rows are :data:`~benchmarks.scenarios._batching.LogRow` request-log rows given as dicts (``--load-rows``,
200,000 by default; 20,000 with ``--quick``), written into the suite's ``request_log`` table (a
unique ``request_id``, a serial key), and the post's creates as rows of ``a`` (``{"data": ...}``, three a
create, ``create_date`` its server default).  Every side runs on fresh tables, on an engine of
:data:`LIMIT` (8) connections opened before the timed part:

* **PostgreSQL, asyncpg** (``SemaphoreRunner(limit=8).load``): the hand-written loop puts chunks of
  :data:`BATCH` records (tuples, turned from the dicts as it goes) on a queue that 8 coroutines take
  from, each chunk ``copy_records_to_table()`` on a pooled connection in a transaction of its own;
  ``batch=500`` ORM units (``SemaphoreRunner(batch=500).run``, a ``session.add(LogRow(**row))`` a unit,
  on :data:`ORM_ROWS` rows) and one transaction per row (:data:`SINGLE_ROWS` rows).  Beside them:
  ``load()`` with a journal (``Journal(job)``, its job forgotten before the side); ``load()`` with 1%
  duplicate keys (every hundredth row or so, at seeded places spread through the input, repeats an
  earlier row's ``request_id``: refused, each alone); the hand-written alternative for duplicates,
  each chunk ``COPY``'d into a temporary staging table and moved with ``INSERT ... ON CONFLICT DO
  NOTHING`` (the duplicates dropped, not reported); ``load()`` at ``batch=`` 1,000 and 20,000
  (:data:`SIZES`) beside the default; the creates' rows: ``load(A, rows)``, the hand loop, ``batch=500``
  ORM units.  And the **row preparation**: the time ``load()`` spends turning the rows into chunks of
  records (its chunk units built from the rows alone, no database), against the whole load's.
* **PostgreSQL, psycopg 3** (``ThreadOffloadRunner(limit=8).load_sync``): 8 threads taking chunks
  from one iterator, each ``cursor.copy()`` ``write_row()`` a record at a time; ``batch=500`` ORM units.
* **MariaDB, aiomysql** (``SemaphoreRunner(limit=8).load``, ``$BOUNDEDDB_BENCH_MYSQL_URL`` or the
  local default; skipped with a note if none answers): 8 coroutines, each chunk one
  ``cursor.executemany()`` (aiomysql sends it as multi-row ``INSERT`` statements) and a commit;
  ``batch=500`` ORM units, one transaction per row.
* **SQLite, pysqlite** (``ThreadOffloadRunner(limit=1).load_sync``: one writer): a file in a
  temporary directory (WAL), one thread, each chunk ``cursor.executemany()`` and a commit, and the
  same thread with multi-row ``INSERT`` statements of :data:`HAND_VALUES` rows, as ``load()`` sends
  them; ``batch=500`` ORM units, one transaction per row.

rows/s is input rows (loaded or rejected) per second of wall time.  Every side's rows are counted
afterwards: each good row exactly once, no duplicate (``rows``).  ``--load-rounds K``
(:data:`DEFAULT_ROUNDS`, 1 with ``--quick``) runs every group K times, each in the opposite order
of the round before; :mod:`benchmarks.report.load` turns the rows into the "Load" section and its
goals (medians of per-round ratios).

Its parts: the rows and the sizes the sides share (:mod:`._load_rows`), the databases
(:mod:`._load_places`), the hand-written loops (:mod:`._load_hand`), a side and its measurement
(:mod:`._load_sides`), the row preparation (:mod:`._load_prep`); here, the groups of sides and the
rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path

from ..db import mysql as mysql_db
from ..db.schema import SCHEMA
from ..harness import Context
from ..scenario import Scenario
from ._load_hand import HAND_VALUES as HAND_VALUES
from ._load_places import Place, _mysql_place, _pg_place, _sqlite_place
from ._load_prep import measure_prep
from ._load_rows import BATCH, ORM_BATCH, Input, create_rows, log_rows, with_duplicates
from ._load_rows import LIMIT as LIMIT
from ._load_rows import ORM_ROWS as ORM_ROWS
from ._load_rows import SINGLE_ROWS as SINGLE_ROWS
from ._load_sides import GROUP, Side, measure

# GROUP, LIMIT, HAND_VALUES, BATCH, ORM_ROWS and SINGLE_ROWS live with the parts that use them, and are
# imported here for the docstring above and this module's readers (benchmarks.report.load, .render).
#: The sizes of batch= measured beside load()'s default, BATCH (asyncpg).
SIZES = (1000, 20000)
#: The rows by default and with --quick; rounds by default and with --quick.
DEFAULT_ROWS, QUICK_ROWS = 200_000, 20_000
DEFAULT_ROUNDS, QUICK_ROUNDS = 3, 1
#: Rough seconds of one round at the default rows on 2 quiet cores, and of the set-up.
SECONDS_PER_ROUND, SETUP_S = 32, 5


def _groups(ctx: Context) -> list[tuple[str, list[Side]]]:
    """The groups of sides, each a set compared within itself, in their forward order."""
    n = ctx.load_rows
    rows = log_rows(n)
    clean = Input("log", rows)
    dup_rows, k = with_duplicates(rows, ctx.seed)
    dups = Input("log", dup_rows, k)
    creates = Input("creates", create_rows(n, ctx.seed))
    pg = [
        (
            "asyncpg",
            [
                Side("asyncpg", "hand", clean),
                Side("asyncpg", "load", clean),
                Side("asyncpg", "load", clean, journal=True),
                Side("asyncpg", "load", dups),
                Side("asyncpg", "staging", dups),
                Side("asyncpg", "orm-batch", clean, ORM_BATCH),
                Side("asyncpg", "orm-single", clean, None),
            ],
        ),
        ("asyncpg sizes", [Side("asyncpg", "load", clean, size) for size in (SIZES[0], BATCH, SIZES[1])]),
        (
            "asyncpg creates",
            [
                Side("asyncpg", "hand", creates),
                Side("asyncpg", "load", creates),
                Side("asyncpg", "orm-batch", creates, ORM_BATCH),
            ],
        ),
        (
            "psycopg",
            [
                Side("psycopg", "hand", clean),
                Side("psycopg", "load", clean),
                Side("psycopg", "orm-batch", clean, ORM_BATCH),
            ],
        ),
    ]
    others = [
        (
            "aiomysql",
            [
                Side("aiomysql", "hand", clean),
                Side("aiomysql", "load", clean),
                Side("aiomysql", "orm-batch", clean, ORM_BATCH),
                Side("aiomysql", "orm-single", clean, None),
            ],
        ),
        (
            "pysqlite",
            [
                Side("pysqlite", "hand", clean),
                Side("pysqlite", "hand-values", clean),
                Side("pysqlite", "load", clean),
                Side("pysqlite", "orm-batch", clean, ORM_BATCH),
                Side("pysqlite", "orm-single", clean, None),
            ],
        ),
    ]
    return pg + others


def _run_side(place: Place, side: Side, round_no: int, rounds: int) -> None:
    try:
        asyncio.run(measure(place, side, round_no, rounds))
    except Exception as exc:
        place.ctx.failed(
            GROUP,
            side.label(round_no, rounds),
            exc,
            group=GROUP,
            **{
                "database": place.name,
                "driver": side.driver,
                "kind": side.kind,
                "workload": side.work.workload,
                "batch": side.batch,
                "journal": side.journal,
                "duplicates": side.work.duplicates,
                "round": round_no,
            },
        )


def run(ctx: Context) -> None:
    rounds = max(1, ctx.load_rounds)
    groups = _groups(ctx)
    places: dict[str, Place | None] = {"asyncpg": _pg_place(ctx), "psycopg": _pg_place(ctx)}
    try:
        places["aiomysql"] = _mysql_place(ctx, mysql_db.resolve())
    except mysql_db.ServerUnavailable as exc:
        places["aiomysql"] = None
        ctx.failed(
            GROUP, "load aiomysql", f"skipped: {exc}", group=GROUP, database="mariadb", driver="aiomysql"
        )
    with tempfile.TemporaryDirectory(prefix="bdbbench-load-") as directory:
        places["pysqlite"] = _sqlite_place(ctx, Path(directory))
        for round_no in range(1, rounds + 1):
            forward = round_no % 2 == 1
            if rounds > 1:
                ctx.log(f"load round {round_no}/{rounds} ({'forward' if forward else 'reverse'})")
            for k, (name, sides) in enumerate(groups if forward else groups[::-1]):
                place = places[name.split()[0]]
                if place is None:
                    continue
                for side in sides if (k + round_no) % 2 else sides[::-1]:
                    _run_side(place, side, round_no, rounds)
                if name == "asyncpg":
                    clean = sides[0].work
                    try:
                        asyncio.run(measure_prep(ctx, clean, round_no, rounds))
                    except Exception as exc:
                        ctx.failed(GROUP, "load prep", exc, group=GROUP, kind="prep", round=round_no)
        with contextlib.suppress(Exception):
            if (mysql_place := places["aiomysql"]) is not None:
                db = mysql_place.ctx.db
                conn = db.connect()
                with conn.cursor() as cursor:
                    cursor.execute(f"DROP DATABASE IF EXISTS {SCHEMA}")
                conn.close()


SCENARIO = Scenario(
    name="load",
    run=run,
    what="runner.load(rows) (COPY on PostgreSQL, multi-row INSERT elsewhere) against a hand-written bulk "
    "loop, "
    "batch=500 ORM units and one transaction per row: 200,000 request-log rows and the post's creates; 1% "
    "duplicate keys; with a journal; batch= 1,000/5,000/20,000; asyncpg, psycopg 3, MariaDB, SQLite",
    section="Load",
    seconds=SETUP_S + DEFAULT_ROUNDS * SECONDS_PER_ROUND,
    default=False,
)
