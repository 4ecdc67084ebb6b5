"""TypeVars and the shapes of units, shared by every module."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

T = TypeVar("T")
ItemT = TypeVar("ItemT")

#: An async unit of work: ``async def unit(session: AsyncSession) -> T``.
AsyncUnit = Callable[[AsyncSession], Awaitable[T]]
#: A sync unit of work, run in a worker thread: ``def unit(session: Session) -> T``.
SyncUnit = Callable[[Session], T]
