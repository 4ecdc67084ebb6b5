"""The tables the tests write to: ``items``, a row per unit."""

from __future__ import annotations

from sqlalchemy import Column, Integer, String
from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    pass


class Item(Base):
    """A row per unit: ``key`` is unique, so a unit that commits twice shows up as an error."""

    __tablename__ = "items"
    id = Column(Integer, primary_key=True)
    key = Column(String(64), unique=True, nullable=False)  # MySQL's VARCHAR needs a length
    unit = Column(Integer)
