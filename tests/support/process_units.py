"""Units for the ProcessRunner tests, at module level: worker processes import them by name."""

from __future__ import annotations

import os
import threading
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, String, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Session


class Base(DeclarativeBase):
    pass


class Row(Base):
    """A row per unit: ``key`` is unique, so a unit that ran twice fails on its second insert."""

    __tablename__ = "process_rows"
    id = Column(Integer, primary_key=True)
    key = Column(String(64), unique=True, nullable=False)
    unit = Column(Integer, nullable=False)
    pid = Column(BigInteger, nullable=False)


def _row(n: int) -> Row:
    return Row(key=f"unit-{n}", unit=n, pid=os.getpid())


async def insert(session: AsyncSession, n: int) -> tuple[int, int]:
    """Insert unit ``n``'s row (not flushed: the COMMIT sends it) and return ``(n, pid)``."""
    session.add(_row(n))
    return n, os.getpid()


def insert_sync(session: Session, n: int) -> tuple[int, int]:
    session.add(_row(n))
    return n, os.getpid()


async def insert_and_sleep(session: AsyncSession, n: int, seconds: float = 0.05) -> int:
    """Insert, then hold the connection ``seconds`` on the server (PostgreSQL)."""
    session.add(_row(n))
    await session.flush()
    await session.execute(text("SELECT pg_sleep(:s)"), {"s": seconds})
    return n


def insert_and_sleep_sync(session: Session, n: int, seconds: float = 0.05) -> int:
    session.add(_row(n))
    session.flush()
    session.execute(text("SELECT pg_sleep(:s)"), {"s": seconds})
    return n


async def fail_some(session: AsyncSession, n: int) -> int:
    """Insert; then units 3, 10, 17, ... raise (rolled back)."""
    session.add(_row(n))
    await session.flush()
    if n % 7 == 3:
        raise ValueError(f"unit {n} fails on purpose")
    return n


def fail_some_sync(session: Session, n: int) -> int:
    session.add(_row(n))
    session.flush()
    if n % 7 == 3:
        raise ValueError(f"unit {n} fails on purpose")
    return n


#: The units that failed their first attempt in this worker process: see :func:`fail_once`.
_failed_once: set[int] = set()


async def fail_once(session: AsyncSession, n: int) -> tuple[int, int]:
    """Insert; the first attempt of each unit in a worker fails as a lost connection would, then it runs."""
    if n not in _failed_once:
        _failed_once.add(n)
        raise ConnectionResetError(f"unit {n}'s first attempt fails on purpose")
    return await insert(session, n)


def fail_once_sync(session: Session, n: int) -> tuple[int, int]:
    if n not in _failed_once:
        _failed_once.add(n)
        raise ConnectionResetError(f"unit {n}'s first attempt fails on purpose")
    return insert_sync(session, n)


async def return_a_lock(session: AsyncSession, n: int) -> Any:
    """Insert, then return what cannot be pickled: the unit must roll back."""
    session.add(_row(n))
    await session.flush()
    return threading.Lock()


class TwoArgumentError(Exception):
    """Pickles, but cannot be unpickled (``__init__`` takes two arguments, ``args`` holds one)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a} and {b}")


async def raise_two_argument_error(session: AsyncSession, n: int) -> None:
    raise TwoArgumentError(n, n + 1)


async def slow_commit_victim(session: AsyncSession, n: int, app: str) -> int:
    """Insert; unit 0 also names its connection after this process, for the test to find and kill it."""
    session.add(_row(n))
    if n == 0:
        name = f"{app}-victim-{os.getpid()}"
        await session.execute(text("SELECT set_config('application_name', :name, false)"), {"name": name})
    return n * 10


async def select_pid(session: AsyncSession, n: int) -> int:
    """A unit that only reads."""
    await session.execute(text("SELECT 1"))
    return os.getpid()


def _export_spans_to_a_file() -> None:
    """In a worker, with $BOUNDEDDB_TEST_SPANS set: a tracer provider writing each span to that file."""
    import json

    path = os.environ.get("BOUNDEDDB_TEST_SPANS")
    if not path:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class ToFile(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            with open(path, "a") as file:
                for span in spans:
                    parent = span.parent
                    record = {
                        "name": span.name,
                        "trace": span.context.trace_id,
                        "parent": None if parent is None else parent.span_id,
                        "pid": os.getpid(),
                    }
                    file.write(json.dumps(record) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ToFile()))
    trace.set_tracer_provider(provider)


_export_spans_to_a_file()
