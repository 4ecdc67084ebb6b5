"""Argument checks that teach the fix, and what a sessionmaker's pool can hold."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any, Literal

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import AssertionPool, Pool, QueuePool, StaticPool

from .._autolimit import AutoLimit, check_positive_int
from .._dialects import Dialect
from .._retry import NO_RETRY, RetryPolicy

ErrorsMode = Literal["raise", "collect"]


def check_errors(errors: object) -> ErrorsMode:
    if errors not in ("raise", "collect"):
        msg = (
            f"errors must be 'raise' (stop at the first failed unit and raise RunFailed) "
            f"or 'collect' (run every unit, failures become outcomes), got {errors!r}"
        )
        raise ValueError(msg)
    return errors


def check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        msg = (
            f"timeout must be a number of seconds (per unit attempt) or None, got {timeout!r} "
            f"({type(timeout).__name__}): pass e.g. timeout=5"
        )
        raise TypeError(msg)
    if not (timeout > 0 and math.isfinite(timeout)):
        msg = f"timeout must be a finite number of seconds > 0 (per unit attempt) or None, got {timeout!r}"
        raise ValueError(msg)
    return float(timeout)


def check_retry(retry: object) -> RetryPolicy:
    if retry is None:
        return NO_RETRY
    if not isinstance(retry, RetryPolicy):
        msg = (
            f"retry must be a boundeddb.RetryPolicy or None, got {retry!r}: "
            "pass e.g. retry=RetryPolicy(attempts=3)"
        )
        raise TypeError(msg)
    return retry


def check_verify_commits(verify_commits: object, dialect: Dialect, database: str) -> bool:
    """``verify_commits`` checked: a bool, and ``True`` only where the database can be asked afterwards."""
    if not isinstance(verify_commits, bool):
        msg = (
            f"verify_commits must be True or False, got {verify_commits!r} "
            f"({type(verify_commits).__name__}): pass verify_commits=True to have the runner ask "
            "PostgreSQL what became of a COMMIT whose connection was lost"
        )
        raise TypeError(msg)
    if verify_commits and dialect.current_xid_sql is None:
        msg = (
            f"verify_commits=True needs PostgreSQL (13 or later), which can be asked what became of a "
            f"transaction after its connection was lost (pg_xact_status); this engine's database is "
            f"{database!r}: pass verify_commits=False (the default), and give units a unique key "
            "to find out what became of a commit_unknown unit"
        )
        raise ValueError(msg)
    return verify_commits


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
    """A runner's limit: fixed (``low == high == initial``), or moving between ``low`` and ``high``."""

    initial: int
    low: int
    high: int
    auto: bool = False
    #: Slots of the limit for priorities above 0 (see :func:`with_reserve`).
    reserve: int = 0


#: Where an auto limit starts unless told (within its bounds).
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


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        msg = (
            f"priority must be an int, got {priority!r} ({type(priority).__name__}): pass e.g. "
            "priority=1 for work that goes ahead of priority-0 work when a slot frees"
        )
        raise TypeError(msg)
    return priority


def with_reserve(plan: LimitPlan, reserve: object, name: str) -> LimitPlan:
    """
    ``plan`` with ``reserve`` slots for priorities above 0, checked against it.

    A fixed limit keeps its number (the reserve is part of it). A moving one keeps the reserve out
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
    """The sync Engine behind a sessionmaker's ``bind`` (an AsyncEngine's ``sync_engine``)."""
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


def checked_iterable(units: object, name: str) -> Iterable[Any] | AsyncIterable[Any]:
    if isinstance(units, (Iterable, AsyncIterable)) and not isinstance(units, (str, bytes)):
        return units
    msg = (
        f"{name} must be an iterable or async iterable of units, got {type(units).__name__}: "
        "pass e.g. a list or a generator of functions that take the session"
    )
    raise TypeError(msg)


def units_of(fn: object, items: object, runner: str) -> Iterable[Any] | AsyncIterable[Any]:
    """Turn ``map(fn, items)`` into lazy units ``fn(session, item)``."""
    if not callable(fn):
        msg = f"fn must be callable as fn(session, item), got {fn!r}: pass the function to {runner}.map()"
        raise TypeError(msg)
    if isinstance(items, AsyncIterable):

        async def bind_async() -> AsyncIterator[Callable[[Any], Any]]:
            async for item in items:
                yield BoundItem(fn, item)

        return bind_async()
    if isinstance(items, Iterable) and not isinstance(items, (str, bytes)):
        return (BoundItem(fn, item) for item in items)
    msg = (
        f"items must be an iterable or async iterable, got {type(items).__name__}: "
        f"pass e.g. a list or a generator of the items to give fn, as {runner}.map(fn, items)"
    )
    raise TypeError(msg)


class BoundItem:
    """``fn(session, item)`` as a unit; keeps ``fn``'s kind visible to unit checks."""

    __slots__ = ("fn", "item")

    def __init__(self, fn: Callable[..., Any], item: Any) -> None:
        self.fn = fn
        self.item = item

    def __call__(self, session: Any) -> Any:
        return self.fn(session, self.item)
