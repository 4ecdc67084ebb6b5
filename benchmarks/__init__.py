"""
The boundeddb benchmark suite: ``python -m benchmarks --help``.

It reproduces the workload of "Soft touch to SQLAlchemy async I/O" (35,000 ORM operations,
half creates and half reads, on PostgreSQL) and measures boundeddb's runners against the
post's own strategies, hand-written equivalents and a raw asyncpg pool, plus the other posts'
experiments, event-loop lag in a real ASGI app and memory use on a million units.
Each scenario is one module in :mod:`benchmarks.scenarios`, whose docstring says what it
reproduces; benchmarks/README.md has the layout.
"""

from __future__ import annotations
