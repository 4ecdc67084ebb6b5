"""TypeVars and the shapes of units, shared by every module."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
ItemT = TypeVar("ItemT")

#: An async unit of work: ``async def unit(session: AsyncSession) -> T``.
AsyncUnit = Callable[[AsyncSession], Awaitable[T]]
#: A sync unit of work, run in a worker thread: ``def unit(session: Session) -> T``.
SyncUnit = Callable[[Session], T]
#: What ``run()`` and ``stream()`` accept: units, pulled lazily.
Units = Iterable[T] | AsyncIterable[T]
