"""
Every database- and driver-specific fact, one module per database, chosen by ``engine.dialect.name``.

A module here defines ``DIALECT``, a :class:`~boundeddb._dialects.base.Dialect`, and ``NAMES``,
the ``engine.dialect.name`` values it serves. The package finds its modules by looking, so adding a
database means adding its module and nothing else.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from .base import COMMITTED_SINCE_RESTART, STATEMENT_ENDED, Dialect

__all__ = ["COMMITTED_SINCE_RESTART", "STATEMENT_ENDED", "Dialect", "all_dialects", "for_name"]


@functools.cache
def _registry() -> dict[str, Dialect]:
    found: dict[str, Dialect] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for name in getattr(module, "NAMES", ()):  # not a database's module: what they share, bulk paths
            found[name] = module.DIALECT
    return found


#: The dialect of a database boundeddb has no module for.
GENERIC = Dialect()


def for_name(name: str) -> Dialect:
    """The dialect for ``engine.dialect.name``, or the generic one for a database without a module."""
    return _registry().get(name, GENERIC)


@functools.cache
def all_dialects() -> tuple[Dialect, ...]:
    """Every known dialect once, for :func:`boundeddb.is_transient`, which sees no engine."""
    return tuple(dict.fromkeys(_registry().values()))
