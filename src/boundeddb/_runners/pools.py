"""How a runner's limit is fitted to the pool of the engine its sessionmaker is bound to."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import AssertionPool, Pool, QueuePool, StaticPool

from .._autolimit import AutoLimit, check_positive_int

__all__ = [
    "LimitPlan",
    "bound_engine",
    "pool_capacity",
    "resolve_limit",
    "resolve_limit_or_auto",
    "with_reserve",
]


def pool_capacity(pool: Pool) -> int | None:
    """How many connections ``pool`` can hand out at once, or ``None`` if it has no fixed cap."""
    if isinstance(pool, QueuePool):
        overflow: int = pool._max_overflow
        return None if overflow < 0 else pool.size() + overflow
    if isinstance(pool, (StaticPool, AssertionPool)):
        return 1  # one connection, shared: units must not overlap on it
    return None


def resolve_limit(name: str, limit: object, engine: Engine, runner: str) -> int:
    """Check ``limit`` against the engine's pool, or default it to the pool's capacity."""
    pool = engine.pool
    capacity = pool_capacity(pool)
    if limit is None:
        if capacity is None:
            msg = (
                f"{runner} needs an explicit {name}: the engine's pool ({type(pool).__name__}) has no fixed "
                f"capacity to default to. Pass {name}=N, at most what the database accepts "
                f"(for example {name}=10)."
            )
            raise ValueError(msg)
        return capacity
    value = check_positive_int(
        name, limit, hint=f"pass how many units may hold a connection at once, e.g. {name}=10"
    )
    if capacity is not None and value > capacity:
        size = pool.size() if isinstance(pool, QueuePool) else capacity
        overflow = capacity - size
        msg = (
            f"{name}={value} is more than the pool can hand out: its capacity is {capacity} "
            f"(pool_size={size} + max_overflow={overflow}), so units would queue for connections "
            f"and could hit the pool timeout. Pass {name}<={capacity}, or create the engine with "
            f"pool_size + max_overflow >= {value}."
        )
        raise ValueError(msg)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class LimitPlan:
    """A runner's limit: fixed, where ``low == high == initial``, or moving between ``low`` and ``high``."""

    initial: int
    low: int
    high: int
    auto: bool = False
    #: Slots of the limit for priorities above 0; see :func:`with_reserve`.
    reserve: int = 0


#: Where an auto limit starts within its bounds, unless told.
AUTO_INITIAL = 4


def resolve_limit_or_auto(name: str, limit: object, engine: Engine, runner: str) -> LimitPlan:
    """:func:`resolve_limit`, also accepting ``"auto"`` and :class:`~boundeddb.AutoLimit`."""
    if limit == "auto":
        limit = AutoLimit()
    if not isinstance(limit, AutoLimit):
        fixed = resolve_limit(name, limit, engine, runner)
        return LimitPlan(fixed, fixed, fixed)
    pool = engine.pool
    capacity = pool_capacity(pool)
    if limit.max_limit is None:
        if capacity is None:
            msg = (
                f"{runner}({name}='auto') needs a ceiling: the engine's pool ({type(pool).__name__}) has "
                f"no fixed capacity. Pass {name}=boundeddb.AutoLimit(max_limit=N), at most what the "
                "database accepts (for example max_limit=20)."
            )
            raise ValueError(msg)
        high = capacity
    else:
        high = resolve_limit("max_limit", limit.max_limit, engine, runner)
    if limit.min_limit > high:
        msg = (
            f"AutoLimit(min_limit={limit.min_limit}) is above the most the limit may reach, {high} "
            f"(the pool's capacity or max_limit): pass min_limit <= {high}"
        )
        raise ValueError(msg)
    initial = limit.initial if limit.initial is not None else AUTO_INITIAL
    if limit.initial is not None and initial > high:
        msg = (
            f"AutoLimit(initial={initial}) is above the most the limit may reach, {high} "
            f"(the pool's capacity or max_limit): pass initial <= {high}"
        )
        raise ValueError(msg)
    return LimitPlan(max(limit.min_limit, min(high, initial)), limit.min_limit, high, auto=True)


def with_reserve(plan: LimitPlan, reserve: object, name: str) -> LimitPlan:
    """
    ``plan`` with ``reserve`` slots for priorities above 0, checked against it.

    A fixed limit keeps its number, and the reserve is part of it. A moving one keeps the reserve out
    of what moves: the slots priority-0 work shares move within ``[low, high - reserve]``, and the
    limit is those plus the reserve.
    """
    if isinstance(reserve, bool) or not isinstance(reserve, int):
        msg = (
            f"reserve must be an int >= 0, got {reserve!r} ({type(reserve).__name__}): pass how many "
            "of the limit's slots only calls with priority > 0 may use, e.g. reserve=1"
        )
        raise TypeError(msg)
    if reserve < 0:
        msg = f"reserve must be >= 0, got {reserve}: pass 0 for no reserve, or e.g. reserve=1"
        raise ValueError(msg)
    if reserve == 0:
        return plan
    if not plan.auto:
        if reserve >= plan.high:
            msg = (
                f"reserve={reserve} must be less than {name}={plan.high}: priority-0 work would never "
                f"get a slot. Pass reserve <= {plan.high - 1}, or a larger {name}."
            )
            raise ValueError(msg)
        return dataclasses.replace(plan, reserve=reserve)
    if plan.high - reserve < plan.low:
        msg = (
            f"reserve={reserve} leaves priority-0 work fewer than min_limit={plan.low} slots under the "
            f"auto limit's ceiling of {plan.high} (the pool's capacity or max_limit): pass "
            f"reserve <= {plan.high - plan.low}, or a larger max_limit and pool."
        )
        raise ValueError(msg)
    return LimitPlan(
        min(plan.high, plan.initial + reserve), plan.low + reserve, plan.high, auto=True, reserve=reserve
    )


def bound_engine(sessions: Any) -> Engine:
    """The sync Engine behind a sessionmaker's ``bind``, which is an AsyncEngine's ``sync_engine``."""
    bind = sessions.kw.get("bind")
    if isinstance(bind, AsyncEngine):
        return bind.sync_engine
    if isinstance(bind, Engine):
        return bind
    msg = (
        f"sessions must be bound to one engine, got bind={bind!r}: "
        "create it as sessionmaker(engine) / async_sessionmaker(engine)"
    )
    raise ValueError(msg)
