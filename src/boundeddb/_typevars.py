"""The type variables every module shares; it imports nothing but :mod:`typing`, so the core may use it."""

from __future__ import annotations

from typing import TypeVar

#: What a unit returns.
T = TypeVar("T")
#: An item that ``map(fn, items)`` hands to ``fn``.
ItemT = TypeVar("ItemT")
