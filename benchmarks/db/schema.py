"""
The post's tables, ``a`` and ``b``, in a schema of the suite's own.

Tables live in their own PostgreSQL schema (on MySQL/MariaDB, their own database: the same name)
so that the suite never touches anyone else's ``a``: ``boundeddb_bench``, or
``$BOUNDEDDB_BENCH_SCHEMA`` so that two runs on one server do not drop each other's tables.
"""

from __future__ import annotations

import os
import re
from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, MetaData, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

DEFAULT_SCHEMA = "boundeddb_bench"
SCHEMA = os.environ.get("BOUNDEDDB_BENCH_SCHEMA") or DEFAULT_SCHEMA
if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", SCHEMA):
    msg = (
        f"BOUNDEDDB_BENCH_SCHEMA={SCHEMA!r} is not a plain lower-case SQL name: "
        "use letters, digits and underscores, e.g. boundeddb_bench_2"
    )
    raise SystemExit(msg)
#: The post's ``Column(String)``: VARCHAR without a length on PostgreSQL; MySQL needs one.
Text = String().with_variant(String(255), "mysql", "mariadb")


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class A(Base):
    __tablename__ = "a"
    # The post's async version sets this so that create_date comes back with the INSERT.
    __mapper_args__ = {"eager_defaults": True}  # noqa: RUF012

    id: Mapped[int] = mapped_column(primary_key=True)
    data: Mapped[str | None] = mapped_column(Text)
    create_date: Mapped[datetime | None] = mapped_column(DateTime, server_default=func.now())
    bs: Mapped[list[B]] = relationship()


class B(Base):
    __tablename__ = "b"

    id: Mapped[int] = mapped_column(primary_key=True)
    # No index: the post's schema; ``--index`` adds one (see Database.reset_schema).
    a_id: Mapped[int | None] = mapped_column(ForeignKey(f"{SCHEMA}.a.id"))
    data: Mapped[str | None] = mapped_column(Text)
