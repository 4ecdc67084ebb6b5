"""The shapes of units of work: functions that take a SQLAlchemy session."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from ._typevars import ItemT, T

__all__ = ["AsyncUnit", "ItemT", "SyncUnit", "T"]

#: An async unit of work: ``async def unit(session: AsyncSession) -> T``.
AsyncUnit = Callable[[AsyncSession], Awaitable[T]]
#: A sync unit of work, run in a worker thread: ``def unit(session: Session) -> T``.
SyncUnit = Callable[[Session], T]
