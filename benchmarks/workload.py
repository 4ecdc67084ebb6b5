"""
The post's workload: the fixed-seed operation sequence, and one op per call.

Each op function does the post's work on a session it is given and leaves committing to its
caller, because boundeddb's runners commit after a unit returns; hand-written scenarios commit
themselves, so every scenario sends the same statements.  The tables are in :mod:`benchmarks.db.schema`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, selectinload

from .db.schema import A, B

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
