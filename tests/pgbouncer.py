"""Kept for `benchmarks/fleet.py`, which imports PgBouncer from here: see tests/support/pgbouncer.py."""

from __future__ import annotations

from tests.support.pgbouncer import DATABASE, PgBouncer, free_port, pgbouncer_binary

__all__ = ["DATABASE", "PgBouncer", "free_port", "pgbouncer_binary"]
