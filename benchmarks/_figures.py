"""Small helpers the report sections share: which rows count, medians, and numbers as text."""

from __future__ import annotations

import statistics

from ._harness import Measurement


def measured(rows: list[Measurement]) -> list[Measurement]:
    """The rows that ran: no error, and a throughput."""
    return [m for m in rows if not m.error and m.ops_per_s]


def shown(value: float | None, digits: int = 1) -> str:
    """``value`` with thousands separators and ``digits`` decimals, ``-`` for None."""
    return "-" if value is None else f"{value:,.{digits}f}"


def median_of(values: list[float | None]) -> float | None:
    """The median of the values that are there, None if none is."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
