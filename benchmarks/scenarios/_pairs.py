"""
The overhead pairs' parts: a :class:`Side` (how one side is measured), a :class:`Pair` (a runner,
its hand-written equivalent and peers), and :func:`run_rounds`, the interleaved rounds that the
``overhead`` scenario and the studies of :mod:`.parity` share (:mod:`.overhead` says how they run).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..harness import Context
from ..otel import instrumented
from ..workload import Op

#: The target: every runner >= this fraction of its hand-written equivalent's ops/s.
TARGET = 0.97
LIBRARY, HAND_WRITTEN = "library", "hand-written"
#: The peer that runs the library side under ``boundeddb.instrument()`` (issue #27's goal: <= 10% more).
INSTRUMENTED = "instrumented"
#: The most ops one overhead measurement runs (N_overhead = min(N, this)).
MAX_OPS = 3_000
WARMUP_OPS = 100


@dataclass(frozen=True)
class Side:
    """One side of a pair: its key in the pair, the stem of its labels, what it runs, how it is measured."""

    key: str
    name: str
    what: str
    #: ``measure(ctx, limit, ops, group=..., label=..., **options)``, awaited if it is a coroutine function.
    measure: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    #: Whether it runs under ``boundeddb.instrument()`` with the OpenTelemetry SDK.
    instrumented: bool = False
    #: The limit it runs at, where the pair fixes one; else the run's ``--limit``.
    limit: int | None = None

    def run(self, ctx: Context, ops: list[Op], group: str, label: str) -> None:
        """One measurement of this side on ``ops``, appended to ``ctx.results``."""
        with instrumented() if self.instrumented else contextlib.nullcontext():
            done = self.measure(ctx, self.limit or ctx.limit, ops, group=group, label=label, **self.options)
            if inspect.iscoroutine(done):
                asyncio.run(done)


@dataclass(frozen=True)
class Pair:
    """A runner, its hand-written equivalent (the yardstick), and peers measured in the same rounds."""

    name: str
    ratio_name: str
    library: Side
    hand: Side
    peers: tuple[Side, ...] = ()
    #: The goal: library / hand-written ops/s, and hand-written / library instructions per op, at least this.
    target: float = TARGET
    #: Whose goal it is and against what, as the target lines say it.
    subject: str = "every runner"
    yardstick: str = "its hand-written equivalent"
    #: The scenario whose rounds run it: ``overhead`` (a plain run's) or a study run by name.
    study: str = "overhead"
    #: Whether the ``instructions`` scenario counts it (a pair that differs from another only in
    #: its callers' number costs the same instructions per op).
    counted: bool = True

    @property
    def sides(self) -> tuple[Side, ...]:
        return (self.library, self.hand, *self.peers)

    def peer_ratio_name(self, peer: Side) -> str:
        return f"{peer.name} / {self.hand.name}"


def order(pair: Pair, k: int) -> tuple[Side, ...]:
    """The sides of ``pair`` in round ``k`` (0-based): forward in even rounds, reversed in odd ones."""
    return pair.sides if k % 2 == 0 else tuple(reversed(pair.sides))


def _measure(ctx: Context, side: Side, ops: list[Op], group: str, label: str) -> None:
    """One measurement; an error outside its probe is recorded too, and the rounds go on."""
    try:
        side.run(ctx, ops, group, label)
    except Exception as exc:
        ctx.failed(side.name, label, exc, group=group)


def run_rounds(ctx: Context, pairs: Iterable[Pair], group: str) -> None:
    """
    A warm-up of every side of ``pairs`` (not recorded), then ``--overhead-rounds`` rounds of them on
    the first ``min(N, MAX_OPS)`` ops, each side's rows marked with its pair, side, round and position.
    """
    pairs = list(pairs)
    ops = ctx.ops[: min(len(ctx.ops), MAX_OPS)]
    rounds = max(1, ctx.overhead_rounds)
    before = len(ctx.results)
    for pair in pairs:
        for side in pair.sides:
            _measure(ctx, side, ops[:WARMUP_OPS], "warm-up", f"warm-up {side.name}")
    del ctx.results[before:]  # the warm-up is not a result
    for k in range(rounds):
        direction = "forward" if k % 2 == 0 else "reversed"
        for pair in pairs:
            for position, side in enumerate(order(pair, k), start=1):
                label = f"{side.name} (L={side.limit or ctx.limit}) round {k + 1}"
                first = len(ctx.results)
                _measure(ctx, side, ops, group, label)
                for m in ctx.results[first:]:
                    m.config.update(
                        pair=pair.name, side=side.key, round=k + 1, position=position, order=direction
                    )
