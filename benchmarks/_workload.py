"""
The post's workload: models A and B, the fixed-seed operation sequence, and one op per call.

Each op function does the post's work on a session it is given and leaves committing to its
caller, because boundeddb's runners commit after a unit returns; hand-written scenarios commit
themselves, so every scenario sends the same statements.
Tables live in their own PostgreSQL schema (on MySQL/MariaDB, their own database: the same name)
so that the suite never touches anyone else's ``a``: ``boundeddb_bench``, or
``$BOUNDEDDB_BENCH_SCHEMA`` so that two runs on one server do not drop each other's tables.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, NamedTuple

from sqlalchemy import DateTime, ForeignKey, MetaData, String, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, selectinload

DEFAULT_SCHEMA = "boundeddb_bench"
SCHEMA = os.environ.get("BOUNDEDDB_BENCH_SCHEMA") or DEFAULT_SCHEMA
if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", SCHEMA):
    msg = (
        f"BOUNDEDDB_BENCH_SCHEMA={SCHEMA!r} is not a plain lower-case SQL name: "
        "use letters, digits and underscores, e.g. boundeddb_bench_2"
    )
    raise SystemExit(msg)
#: The post's ``Column(String)``: VARCHAR without a length on PostgreSQL; MySQL needs one.
Text = String().with_variant(String(255), "mysql", "mariadb")


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class A(Base):
    __tablename__ = "a"
    # The post's async version sets this so that create_date comes back with the INSERT.
    __mapper_args__ = {"eager_defaults": True}  # noqa: RUF012

    id: Mapped[int] = mapped_column(primary_key=True)
    data: Mapped[str | None] = mapped_column(Text)
    create_date: Mapped[datetime | None] = mapped_column(DateTime, server_default=func.now())
    bs: Mapped[list[B]] = relationship()


class B(Base):
    __tablename__ = "b"

    id: Mapped[int] = mapped_column(primary_key=True)
    # No index: the post's schema; ``--index`` adds one (see _db.reset_schema).
    a_id: Mapped[int | None] = mapped_column(ForeignKey(f"{SCHEMA}.a.id"))
    data: Mapped[str | None] = mapped_column(Text)


READ_STMT = select(A).options(selectinload(A.bs)).limit(10)


class Op(NamedTuple):
    """One operation of the sequence: a create (with its random data) or a read."""

    kind: Literal["create", "read"]
    data: int = 0


def make_ops(n: int, seed: int) -> list[Op]:
    """``n`` ops, half creates and half reads, shuffled with a fixed seed."""
    rng = random.Random(seed)
    creates = [Op("create", rng.randint(1, 100_000)) for _ in range(n // 2)]
    ops = creates + [Op("read")] * (n - len(creates))
    rng.shuffle(ops)
    return ops


def _new_as(data: int) -> list[A]:
    return [
        A(bs=[B(), B()], data=str(data + 1)),
        A(bs=[B()], data=str(data + 2)),
        A(bs=[B(), B()], data=str(data + 3)),
    ]


def _touch(result: Any) -> int:
    """Walk every A and every child B, as the post's loop does (without printing)."""
    seen = 0
    for a in result.scalars():
        for b in a.bs:
            seen += b.id
    return seen


async def op_async(session: AsyncSession, op: Op) -> int:
    """Run ``op`` on an AsyncSession, leaving the commit to the caller."""
    if op.kind == "create":
        session.add_all(_new_as(op.data))
        await session.flush()
        return 3
    return _touch(await session.execute(READ_STMT))


def op_sync(session: Session, op: Op) -> int:
    """Run ``op`` on a Session, leaving the commit to the caller."""
    if op.kind == "create":
        session.add_all(_new_as(op.data))
        session.flush()
        return 3
    return _touch(session.execute(READ_STMT))


def async_unit(op: Op, tick: Callable[[], None] | None = None) -> Callable[[AsyncSession], Any]:
    """A boundeddb async unit for ``op``; it reports progress through ``tick``, if given."""
    if tick is None:  # the runner shows its own progress (see Probe.runner_progress)

        async def plain(session: AsyncSession) -> int:
            return await op_async(session, op)

        return plain

    async def unit(session: AsyncSession) -> int:
        value = await op_async(session, op)
        tick()
        return value

    return unit


def sync_unit(op: Op, tick: Callable[[], None] | None = None) -> Callable[[Session], int]:
    """A boundeddb thread unit for ``op``; it reports progress through ``tick``, if given."""
    if tick is None:

        def plain(session: Session) -> int:
            return op_sync(session, op)

        return plain

    def unit(session: Session) -> int:
        value = op_sync(session, op)
        tick()
        return value

    return unit


# The statements the ORM sends, written out for the raw asyncpg scenario.
RAW_INSERT_A = f"INSERT INTO {SCHEMA}.a (data) VALUES ($1), ($2), ($3) RETURNING id, create_date"
RAW_INSERT_B = (
    f"INSERT INTO {SCHEMA}.b (a_id, data)"
    " VALUES ($1, NULL), ($1, NULL), ($2, NULL), ($3, NULL), ($3, NULL) RETURNING id"
)
RAW_READ_A = f"SELECT id, data, create_date FROM {SCHEMA}.a LIMIT $1"


def raw_read_b(k: int) -> str:
    """The selectinload query for ``k`` parent ids (the ORM expands IN to k parameters)."""
    params = ", ".join(f"${i}" for i in range(1, k + 1))
    return f"SELECT a_id, id, data FROM {SCHEMA}.b WHERE a_id IN ({params})"
