"""
The ``load`` scenario's rows (:mod:`.load`): request-log rows as dicts, the copy with 1% duplicate
keys and the rows that key repeats, the post's creates as rows of ``a``, the :class:`Input` of a
side, and the sizes the sides share.

The request-log rows are :data:`~benchmarks.scenarios._batching.LogRow` rows given as dicts, for the
suite's ``request_log`` table (a unique ``request_id``, a serial key); the post's creates are rows of
``a`` (``{"data": ...}``, three a create, ``create_date`` its server default).
"""

from __future__ import annotations

import dataclasses
import operator
import random
from typing import Any

from ..db.schema import A
from ._batching import LogRow

#: Connections (so chunks in flight) on PostgreSQL and MariaDB; SQLite has one writer.
LIMIT = 8
#: load()'s default rows per transaction (the hand-written loops' chunks too).
BATCH = 5000
#: The ORM sides' rows: batch=500 units, and one transaction per row (their rows/s does not need 200,000).
ORM_BATCH = 500
ORM_ROWS = 40_000
SINGLE_ROWS = 3_000
#: The share of rows that repeat an earlier row's key.
DUP_SHARE = 0.01
LOG_COLUMNS = ("request_id", "path", "status", "duration_ms")
CREATE_COLUMNS = ("data",)


def log_rows(n: int) -> list[dict[str, Any]]:
    """``n`` request-log rows as dicts, each ``request_id`` its index."""
    return [
        {
            "request_id": i,
            "path": f"/items/{i % 997}",
            "status": 404 if i % 10 == 0 else 200,
            "duration_ms": (i % 50) / 10,
        }
        for i in range(n)
    ]


def with_duplicates(rows: list[dict[str, Any]], seed: int) -> tuple[list[dict[str, Any]], int]:
    """
    A copy of ``rows`` in which :data:`DUP_SHARE` of them, at seeded places spread through the input,
    carry a key already in the table (-1, -2, ...: :func:`seed_rows`, written before the side); and how
    many.  Keys already committed, not keys of other rows of the input: two chunks in flight that
    insert each other's keys wait for each other, and PostgreSQL ends one with a deadlock.
    """
    rng = random.Random(seed)
    out = [dict(r) for r in rows]
    places = sorted(rng.sample(range(len(rows)), max(1, round(len(rows) * DUP_SHARE))))
    for j, p in enumerate(places):
        out[p]["request_id"] = -(j + 1)
    return out, len(places)


def seed_rows(k: int) -> list[dict[str, Any]]:
    """The rows whose keys the duplicates repeat, in the table before a side with duplicates."""
    return [{"request_id": -(j + 1), "path": "/seed", "status": 200, "duration_ms": 0.0} for j in range(k)]


def create_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """The post's creates as ``n`` rows of ``a``: three a create, ``data`` as the post makes it."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    while len(out) < n:
        data = rng.randint(1, 100_000)
        out += [{"data": str(data + k)} for k in (1, 2, 3)]
    return out[:n]


@dataclasses.dataclass(frozen=True)
class Input:
    """The rows of one side: what they are, the table, and what they should leave."""

    workload: str  # "log" or "creates"
    rows: list[dict[str, Any]]
    duplicates: int = 0

    @property
    def columns(self) -> tuple[str, ...]:
        return LOG_COLUMNS if self.workload == "log" else CREATE_COLUMNS

    @property
    def target(self) -> Any:
        return LogRow if self.workload == "log" else A

    @property
    def table(self) -> str:
        return "request_log" if self.workload == "log" else "a"

    def records(self, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        """What a hand-written loop sends: each dict's values in the columns' order."""
        if len(self.columns) == 1:
            key = self.columns[0]
            return [(r[key],) for r in rows]
        get = operator.itemgetter(*self.columns)
        return [get(r) for r in rows]

    def orm(self, row: dict[str, Any]) -> Any:
        return LogRow(**row) if self.workload == "log" else A(**row)
