"""
``post-002``: post 002's library benchmark, sync SQLAlchemy against an aiomysql pool, on MySQL.

100 single-row inserts one at a time, with autocommit off and on, with explicit transactions, and
with connections that are never returned to the pool (MySQL/MariaDB only: ``--database mysql``).

Post 002 ("python, db library benchmark (feat. sqlalchemy vs aiomysql)") timed ``LOOP = 100`` inserts
``insert into test.test(name,address) VALUES ("...","...")`` of Faker names, each on a connection
taken from a pool and given back, in two tests, and concluded:

1. *autocommit*: with autocommit off sync SQLAlchemy (``mysql://...?autocommit=false``,
   ``pool_size=100``) was faster than aiomysql (``create_pool(autocommit=False)``), "returning the
   connection being costly in async"; with autocommit on it was slower;
2. *transactions* (``conn.begin()`` ... ``commit()`` on both sides, an aiomysql pool of
   ``minsize=100, maxsize=200``): sync SQLAlchemy was faster than aiomysql.

Each test also had an aiomysql variant that never gives its connections back ("pool not returned").

This module runs every variant on the post's sizes (:data:`LOOP` inserts, pools of
:data:`POOL_MIN_SIZE`), each timing exactly the post's loop on a fresh engine or pool, in
``--post-002-rounds`` rounds whose order alternates (forward in odd rounds, reversed in even ones)
after one unrecorded warm-up round, so that the spread shows.  What differs from the post:

* SQLAlchemy 2 has no library-level autocommit: the post's 1.4 code (``conn.execute(str)``, which
  committed an ``INSERT`` by itself) becomes ``conn.exec_driver_sql(sql); conn.commit()``;
* ``mysql://`` is mysqlclient (``mysql+mysqldb``), as in the post; where mysqlclient is not
  installed the sync side runs on pymysql and says so; the transactions test also runs the sync side
  on pymysql, the pure-Python protocol code aiomysql was ported from;
* the names and addresses are generated before the timed loop, not by Faker inside it;
* "pool not returned" runs with ``maxsize=200`` (the post's commented-out ``POOL_MIN_SIZE + 100``):
  with aiomysql's default ``maxsize=10`` the loop cannot finish, which
  :func:`~benchmarks.scenarios._post002_paths.default_pool_check`
  shows once (the 11th ``acquire()`` waits for ever);
* between two measurements the table is truncated and the suite waits :data:`PAUSE_S` (the post: 2 s).

Beside the post's variants, boundeddb's runners do the same 100 inserts, one per unit in its own
transaction: ``SemaphoreRunner`` on aiomysql and ``ThreadOffloadRunner.run_sync`` on the sync
driver, at limit 1 (one at a time, as the post's loops) and at limit L.  Each measurement records its
wall and CPU time, each insert's latency, the connections it opened, the rows it left committed and
the ``@@autocommit`` its connections ran with; the report compares the sides round by round.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..db.schema import SCHEMA
from ..harness import Context
from ..measurement import Measurement
from ..scenario import MYSQL, Scenario
from ..stats import percentile
from . import _post002_paths as paths
from ._post002_paths import POOL_MIN_SIZE, Timing, sync_driver

GROUP = "post-002"
#: The post's number of inserts per measurement.
LOOP = 100
DEFAULT_ROUNDS = 10
#: The table is truncated between measurements, then the suite waits this long (the post: 2 s).
PAUSE_S = 0.5
TABLE = f"{SCHEMA}.post002"
INSERT = 'insert into {table}(name,address) VALUES ("{name}","{address}")'


@dataclass(frozen=True)
class Sync:
    """A sync SQLAlchemy loop: its driver (None: :func:`sync_driver`'s), the URL's query, begin/commit."""

    driver: str | None = None
    query: str = ""
    transaction: bool = False


@dataclass(frozen=True)
class Aio:
    """An aiomysql loop: the pool's autocommit and sizes, begin/commit, connections given back or kept."""

    autocommit: bool
    pool: dict[str, int]
    transaction: bool = False
    returned: bool = True


@dataclass
class Variant:
    """One of the post's code paths (or boundeddb's), timed on :data:`LOOP` inserts."""

    key: str
    test: str
    label: str
    driver: str
    what: str
    measure: Callable[[Context, list[str]], Timing]
    #: Connections it holds at once (for the free-connections check), and its pool settings.
    needs: int = 1
    config: dict[str, Any] = field(default_factory=dict)


def statements(n: int, seed: int) -> list[str]:
    """``n`` inserts of the post's shape, with Korean-looking names and street addresses."""
    rng = random.Random(seed)

    def hangul(k: int) -> str:
        return "".join(chr(0xAC00 + rng.randrange(11_172)) for _ in range(k))

    return [
        INSERT.format(table=TABLE, name=hangul(3), address=f"{hangul(2)}로 {rng.randint(1, 999)}")
        for _ in range(n)
    ]


# -- the variants -----------------------------------------------------------------------------------

#: aiomysql's pools: its defaults (the post's test 1), the post's commented-out maxsize, test 2's.
SMALL = {"minsize": 1, "maxsize": 10}
BIG = {"minsize": 1, "maxsize": POOL_MIN_SIZE + 100}
TX_POOL = {"minsize": POOL_MIN_SIZE, "maxsize": POOL_MIN_SIZE + 100}
OFF, ON, TX = "autocommit off", "autocommit on", "transactions"
CONNECT = "connect, insert, commit, close"
ACQUIRE = "acquire, cursor, insert, close, release"
KEPT = "without closing the cursor and releasing the connection"

#: The post's variants in the order of odd rounds, each aiomysql one next to its sync rivals: key,
#: test, how it runs, label (``{sa}``: SQLAlchemy on the sync driver) and what it does.
# fmt: off
POST_VARIANTS: tuple[tuple[str, str, Sync | Aio, str, str], ...] = (
    ("sa-url-false", OFF, Sync(query="autocommit=false"), "{sa}, ?autocommit=false",
     f"the post's URL mysql://...?autocommit=false; {CONNECT}"),
    ("aiomysql-off", OFF, Aio(False, SMALL), "aiomysql pool, autocommit=False",
     f"create_pool(autocommit=False), minsize 1, maxsize 10; {ACQUIRE}"),
    ("sa-off", OFF, Sync(), "{sa}, driver autocommit off",
     f"no autocommit in the URL (the driver's default: off); {CONNECT}"),
    ("aiomysql-off-kept", OFF, Aio(False, BIG, returned=False),
     "aiomysql pool, autocommit=False, not returned", f"as aiomysql-off {KEPT}; maxsize 200"),
    ("sa-url-true", ON, Sync(query="autocommit=true"), "{sa}, ?autocommit=true",
     f"URL mysql://...?autocommit=true; {CONNECT}"),
    ("aiomysql-on", ON, Aio(True, SMALL), "aiomysql pool, autocommit=True",
     f"create_pool(autocommit=True), minsize 1, maxsize 10; {ACQUIRE}"),
    ("aiomysql-on-kept", ON, Aio(True, BIG, returned=False), "aiomysql pool, autocommit=True, not returned",
     f"as aiomysql-on {KEPT}; maxsize 200"),
    ("sa-tx", TX, Sync(transaction=True), "{sa}, begin/commit", "connect, begin, insert, commit, close"),
    ("aiomysql-tx", TX, Aio(False, TX_POOL, transaction=True), "aiomysql pool (100-200), begin/commit",
     "create_pool(minsize=100, maxsize=200, autocommit=False); acquire, begin, cursor, insert, commit, "
     "close, release"),
    ("sa-pymysql-tx", TX, Sync("pymysql", transaction=True), "SQLAlchemy (pymysql), begin/commit",
     "as sa-tx on pymysql, the protocol code aiomysql was ported from"),
    ("aiomysql-tx-small", TX, Aio(False, SMALL, transaction=True), "aiomysql pool (1-10), begin/commit",
     "as aiomysql-tx on aiomysql's default pool, minsize 1, maxsize 10 (not in the post)"),
    ("aiomysql-tx-kept", TX, Aio(False, BIG, transaction=True, returned=False),
     "aiomysql pool, begin/commit, not returned", f"as aiomysql-tx {KEPT}; minsize 1, maxsize 200"),
)
# fmt: on


def _post_variant(key: str, test: str, how: Sync | Aio, label: str, what: str, sync: str) -> Variant:
    label = label.format(sa=f"SQLAlchemy ({sync})")
    if isinstance(how, Sync):
        driver = how.driver or sync
        measure = paths.sa_test(driver, query=how.query, transaction=how.transaction)
        return Variant(
            key, test, label, driver, what, measure, config={"url_query": how.query} if how.query else {}
        )
    measure = paths.aiomysql_test(
        transaction=how.transaction, returned=how.returned, autocommit=how.autocommit, **how.pool
    )
    needs = how.pool["minsize"] if how.returned else LOOP
    return Variant(
        key, test, label, "aiomysql", what, measure, needs, {"autocommit": how.autocommit, **how.pool}
    )


def variants(limit: int) -> list[Variant]:
    """Every variant, in the order of odd rounds: the post's, then boundeddb's at limit 1 and L."""
    sync = sync_driver()
    out = [_post_variant(*row, sync) for row in POST_VARIANTS]
    unit = "one unit per insert, committed by the runner"
    for k in (1, limit):
        what = f"{unit}; AsyncSession on aiomysql, pool_size={k}"
        out.append(Variant(f"semaphore-{k}", "boundeddb", f"SemaphoreRunner (L={k})", "aiomysql", what,
                           paths.semaphore_test(k), k, {"limit": k}))  # fmt: skip
    for k in (1, limit):
        what, label = f"{unit}; Session on {sync}, pool_size={k}", f"ThreadOffloadRunner.run_sync (L={k})"
        out.append(
            Variant(
                f"threads-{k}", "boundeddb", label, sync, what, paths.threads_test(sync, k), k, {"limit": k}
            )
        )
    return out


#: The post's claims, each a comparison of an aiomysql variant with a sync one (time ratio aiomysql / sync).
CLAIMS = (
    ("autocommit off", "aiomysql-off", "sa-url-false", "sync faster (the post's URL)"),
    ("autocommit off", "aiomysql-off", "sa-off", "sync faster (autocommit really off)"),
    ("autocommit on", "aiomysql-on", "sa-url-true", "sync slower"),
    ("transactions", "aiomysql-tx", "sa-tx", "sync faster"),
    ("transactions", "aiomysql-tx", "sa-pymysql-tx", "sync faster (pymysql)"),
    ("transactions", "aiomysql-tx-small", "sa-tx", "(not in the post: aiomysql's default pool)"),
)


# -- running ----------------------------------------------------------------------------------------


def _admin(ctx: Context) -> Any:
    return ctx.db.connect()


def _execute(ctx: Context, *sqls: str) -> list[Any]:
    conn = _admin(ctx)
    try:
        with conn.cursor() as cursor:
            rows: list[Any] = []
            for sql in sqls:
                cursor.execute(sql)
                rows = list(cursor.fetchall())
            return rows
    finally:
        conn.close()


def _fresh_table(ctx: Context) -> None:
    _execute(
        ctx,
        f"CREATE DATABASE IF NOT EXISTS {SCHEMA}",
        f"DROP TABLE IF EXISTS {TABLE}",
        f"CREATE TABLE {TABLE} (idx int AUTO_INCREMENT PRIMARY KEY, name varchar(100) NOT NULL, "
        "address varchar(200) NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    )


def _measure(ctx: Context, v: Variant, sqls: list[str], round_no: int, order: str) -> Measurement:
    config = {"variant": v.key, "test": v.test, "driver": v.driver, "loop": LOOP, "round": round_no,
              "order": order, "what": v.what, **v.config}  # fmt: skip
    m = Measurement(scenario=GROUP, label=v.label, group=GROUP, n=len(sqls), config=config)
    try:
        t = v.measure(ctx, sqls)
    except Exception as exc:
        m.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        with contextlib.suppress(Exception):
            _execute(ctx, f"TRUNCATE TABLE {TABLE}")
        return m
    m.wall_s, m.client_cpu_s = t.wall_s, t.cpu_s
    m.p50_s, m.p99_s = percentile(t.latencies, 0.5), percentile(t.latencies, 0.99)
    m.max_s = max(t.latencies, default=None)
    ((committed,),) = _execute(ctx, f"SELECT count(*) FROM {TABLE}")
    m.succeeded = len(t.latencies)
    m.ops_per_s = m.succeeded / t.wall_s if t.wall_s > 0 else None
    m.extra.update(
        rows_committed=int(committed),
        connections_opened=t.connections,
        autocommit=t.autocommit,
        loadavg_1m=round(os.getloadavg()[0], 2),
    )
    _execute(ctx, f"TRUNCATE TABLE {TABLE}")
    return m


def run(ctx: Context) -> None:
    paths.require_mysql(ctx)
    _fresh_table(ctx)
    every = variants(ctx.limit)
    free = ctx.db.free_connections()
    sqls = statements(LOOP, ctx.seed)
    try:
        check = asyncio.run(paths.default_pool_check(ctx, sqls))
        config = {"variant": "check"}
        ctx.results.append(Measurement(GROUP, "default pool check", group=GROUP, config=config, extra=check))
        _execute(ctx, f"TRUNCATE TABLE {TABLE}")
        for round_no in range(ctx.post_002_rounds + 1):  # round 0: the warm-up, not recorded
            order = "forward" if round_no % 2 == 1 or round_no == 0 else "reverse"
            todo = every if order == "forward" else every[::-1]
            for v in todo:
                if v.needs + 1 > free:
                    if round_no == 1:
                        error = f"needs {v.needs} connections at once; the server had {free} free"
                        config = {"variant": v.key, "round": 1}
                        ctx.results.append(
                            Measurement(GROUP, v.label, group=GROUP, config=config, error=error)
                        )
                    continue
                m = _measure(ctx, v, sqls, round_no, order)
                time.sleep(PAUSE_S)
                if round_no:
                    ctx.results.append(m)
                elif m.error:
                    ctx.log(f"post-002 warm-up: {v.label}: {m.error}")
            if round_no:
                done = [m for m in ctx.results if m.group == GROUP and m.config.get("round") == round_no]
                shown_ = ", ".join(
                    f"{m.config['variant']} {(m.wall_s or 0) * 1e3:.0f}" for m in done if not m.error
                )
                ctx.log(f"post-002 round {round_no}/{ctx.post_002_rounds} ({order}), ms per {LOOP}: {shown_}")
    finally:
        with contextlib.suppress(Exception):
            _execute(ctx, f"DROP TABLE IF EXISTS {TABLE}")


SCENARIO = Scenario(
    name="post-002",
    run=run,
    what="post 002: sync SQLAlchemy against an aiomysql pool on 100 inserts, in alternating rounds",
    section="Post 002",
    seconds=160,
    databases=(MYSQL,),
)
