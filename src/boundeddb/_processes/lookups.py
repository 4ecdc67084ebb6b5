"""
A ProcessRunner call's journal lookups, asked of its workers: the parent holds no connection, so
every connection of the call is inside ``limit``.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from .._dialects import Dialect
from .._journal import Journal
from .fleet import Fleet
from .protocol import Kind

__all__ = ["WorkerLookups"]


class WorkerLookups:
    """
    Which keys of a journal have a row, as :class:`~boundeddb._runners.journal_rows.JournalRows`
    answers it, each lookup run by a worker within its share of the limit (asked again of another
    worker if that one dies first), which retries it as it retries its units. The first one creates
    the table, as the journal says.
    """

    def __init__(self, fleet: Fleet, kind: Kind, journal: Journal[Any], dialect: Dialect) -> None:
        self._fleet = fleet
        self._kind = kind
        self._journal = (journal.job, journal.table, journal.create_table)
        #: The most keys one lookup asks for.
        self.most_keys = dialect.most_keys_looked_up

    async def done(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have a row: one query, on a worker's connection."""
        answer = self._fleet.look_up(self._kind, self._journal, keys)
        # The worker answers after its retries, if any: a cancelled call stops waiting at once.
        return await anyio.to_thread.run_sync(answer.result, abandon_on_cancel=True)
