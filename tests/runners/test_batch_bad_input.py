"""
A bad ``batch=`` fails at construction, before any unit runs: a ValueError or TypeError whose message
names the argument (``batch``, or ``size``/``linger`` of BatchPolicy) and the value given.

Runners are built on SQLite engines that never connect (as in test_bad_input.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import Pool

import boundeddb
from boundeddb import BatchPolicy, ChunkedRunner, SemaphoreRunner, ThreadOffloadRunner

RUNNERS = ["SemaphoreRunner", "ChunkedRunner", "ThreadOffloadRunner"]


class Builder:
    """A runner of the named class on a never-connected SQLite engine; its pool, to check it is untouched."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "never-opened.sqlite3"
        self.pool: Pool | None = None

    def runner(self, name: str, **options: Any) -> Any:
        if name == "ThreadOffloadRunner":
            engine = create_engine(f"sqlite:///{self.path}", pool_size=5, max_overflow=0)
            self.pool = engine.pool
            return ThreadOffloadRunner(sessionmaker(engine), limit=4, **options)
        async_engine = create_async_engine(f"sqlite+aiosqlite:///{self.path}", pool_size=5, max_overflow=0)
        self.pool = async_engine.sync_engine.pool
        if name == "ChunkedRunner":
            return ChunkedRunner(async_sessionmaker(async_engine), chunk_size=4, **options)
        return SemaphoreRunner(async_sessionmaker(async_engine), limit=4, **options)

    def assert_untouched(self) -> None:
        assert self.pool is not None
        assert (self.pool.checkedin(), self.pool.checkedout()) == (0, 0), "a connection was opened"


@pytest.fixture
def build(tmp_path: Path) -> Builder:
    return Builder(tmp_path)


def says(*phrases: str) -> str:
    """A pattern for pytest.raises(match=...): every phrase, in this order, anywhere in the message."""
    return "(?s)" + ".*".join(re.escape(phrase) for phrase in phrases)


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize(
    ("batch", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (2.5, TypeError),
        ("50", TypeError),
        (True, TypeError),
        ([50], TypeError),
    ],
    ids=["zero", "negative", "float", "str", "bool", "list"],
)
def test_a_bad_batch_is_refused_at_construction(
    build: Builder, runner: str, batch: object, error: type[Exception]
) -> None:
    """batch=0, -1, 2.5, "50", True, [50]: an error naming batch and the value, no connection opened."""
    with pytest.raises(error, match=says("batch", repr(batch))):
        build.runner(runner, batch=batch)
    build.assert_untouched()


POLICIES: list[tuple[Callable[[], BatchPolicy], type[Exception], str, str]] = [
    (lambda: BatchPolicy(size=0), ValueError, "size", "0"),
    (lambda: BatchPolicy(size=-5), ValueError, "size", "-5"),
    (lambda: BatchPolicy(size=2.5), TypeError, "size", "2.5"),  # type: ignore[arg-type]
    (lambda: BatchPolicy(size="50"), TypeError, "size", "'50'"),  # type: ignore[arg-type]
    (lambda: BatchPolicy(size=True), TypeError, "size", "True"),
    (lambda: BatchPolicy(size=5, linger=-1), ValueError, "linger", "-1"),
    (lambda: BatchPolicy(size=5, linger=math.inf), ValueError, "linger", "inf"),
    (lambda: BatchPolicy(size=5, linger=math.nan), ValueError, "linger", "nan"),
    (lambda: BatchPolicy(size=5, linger="0.1"), TypeError, "linger", "'0.1'"),  # type: ignore[arg-type]
    (lambda: BatchPolicy(size=5, linger=True), TypeError, "linger", "True"),
]
POLICY_IDS = [
    "size-zero",
    "size-negative",
    "size-float",
    "size-str",
    "size-bool",
    "linger-negative",
    "linger-inf",
    "linger-nan",
    "linger-str",
    "linger-bool",
]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize(("policy", "error", "name", "value"), POLICIES, ids=POLICY_IDS)
def test_a_bad_batch_policy_is_refused_before_any_runner_exists(
    build: Builder,
    runner: str,
    policy: Callable[[], BatchPolicy],
    error: type[Exception],
    name: str,
    value: str,
) -> None:
    """BatchPolicy(size=0), linger=-1, inf, nan...: an error naming size or linger and the value."""
    with pytest.raises(error, match=says(name, value)):
        build.runner(runner, batch=policy())
    assert build.pool is None, "the error came before the runner's engine was made"


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize(
    "batch",
    [None, 1, 50, BatchPolicy(size=500, linger=0.005), BatchPolicy(size=1, linger=0.0), BatchPolicy(size=2)],
    ids=["None", "1", "50", "policy", "policy-of-one", "policy-no-linger"],
)
def test_good_batches_are_accepted(build: Builder, runner: str, batch: object) -> None:
    """None, ints >= 1 and BatchPolicy values make a runner, without connecting."""
    assert build.runner(runner, batch=batch) is not None
    build.assert_untouched()


def test_batch_policy_is_a_frozen_exported_value() -> None:
    """BatchPolicy is public, frozen and compared by value, with linger 0 by default."""
    assert "BatchPolicy" in boundeddb.__all__
    assert BatchPolicy.__module__ == "boundeddb"
    policy = BatchPolicy(size=50)
    assert policy == BatchPolicy(50, 0.0)
    assert policy.linger == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.size = 10  # type: ignore[misc]
