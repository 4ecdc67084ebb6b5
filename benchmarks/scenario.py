"""
The :class:`Scenario` record: how each scenario module declares itself to the suite.

A scenario module (in :mod:`benchmarks.scenarios`) holds one record per ``--scenario`` name it
offers; :data:`benchmarks.scenarios.catalog.ALL` lists them all in the order a run takes them.  The record
says what the scenario runs, on which databases, how ``--rounds`` and ``--index`` treat it,
where its rows go in the report, whether a plain run includes it, and about how long it takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .harness import Context

POSTGRESQL: Literal["postgresql"] = "postgresql"
MYSQL: Literal["mysql"] = "mysql"
Database = Literal["postgresql", "mysql"]


@dataclass(frozen=True)
class Scenario:
    """One ``--scenario NAME`` of the suite."""

    #: What ``--scenario`` calls it.
    name: str
    #: Runs it once on the context's schema, appending its rows to ``ctx.results``.
    run: Callable[[Context], None]
    #: What it runs or measures, in a few words (``--help`` and benchmarks/README.md list it).
    what: str
    #: The heading of the report section its rows go to.
    section: str
    #: Rough seconds at the default settings (N=5,000, one schema) on the 2-core development
    #: machine: a guide to how long a run takes, not a measurement.
    seconds: int
    #: The ``--database`` choices it runs on.
    databases: tuple[Database, ...] = (POSTGRESQL,)
    #: A row of the throughput table: ``--rounds K`` runs it K times.
    throughput: bool = False
    #: ``--index`` runs it a second time, on the schema with an index on ``b.a_id``.
    index_pass: bool = False
    #: In the default set (a run without ``--scenario``); else only with ``--scenario`` or ``--full``.
    default: bool = True


def throughput_row(
    name: str,
    run: Callable[[Context], None],
    what: str,
    *,
    seconds: int,
    databases: tuple[Database, ...] = (POSTGRESQL,),
) -> Scenario:
    """The record of a scenario that runs the op sequence once per row of the throughput table."""
    return Scenario(
        name, run, what, "Throughput", seconds, databases=databases, throughput=True, index_pass=True
    )
