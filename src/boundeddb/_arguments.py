"""Argument checks that all runners share, ProcessRunner too: each error names the argument and the fix."""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, Iterable
from typing import Any, Literal

from ._dialects import Dialect
from ._retry import NO_RETRY, RetryPolicy

__all__ = [
    "ErrorsMode",
    "check_errors",
    "check_priority",
    "check_retry",
    "check_timeout",
    "check_verify_commits",
    "checked_iterable",
]


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


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        msg = (
            f"priority must be an int, got {priority!r} ({type(priority).__name__}): pass e.g. "
            "priority=1 for work that goes ahead of priority-0 work when a slot frees"
        )
        raise TypeError(msg)
    return priority


def checked_iterable(units: object, name: str) -> Iterable[Any] | AsyncIterable[Any]:
    if isinstance(units, (Iterable, AsyncIterable)) and not isinstance(units, (str, bytes)):
        return units
    msg = (
        f"{name} must be an iterable or async iterable of units, got {type(units).__name__}: "
        "pass e.g. a list or a generator of functions that take the session"
    )
    raise TypeError(msg)
