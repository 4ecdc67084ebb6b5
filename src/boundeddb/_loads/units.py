"""
A ``load()``'s chunk units: each writes one chunk in its session's transaction, finds the rows the
database refuses with a :class:`~boundeddb._core.rejects.RowSearch` and rejects them alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from .._core.rejects import Attempt, RowSearch
from .._dialects import Dialect
from .._dialects.bulk import BulkWriter
from .._dialects.refusals import Refused, is_duplicate_key
from .._outcome import ChunkResult, RejectedRow
from .chunks import Chunk
from .keys import KeyCheck, KeyQuery
from .references import MissingQuery, ReferenceCheck
from .target import LoadTarget

__all__ = ["AsyncChunkUnit", "ChunkSettings", "ChunkUnit", "FirstRefused", "SyncChunkUnit"]


class FirstRefused(Exception):
    """A refused row with ``errors="raise"``: its chunk rolls back and the load stops."""

    def __init__(self, rejected: RejectedRow) -> None:
        super().__init__(rejected.index, rejected.error)
        self.rejected = rejected


def _without_tracebacks(error: Exception) -> Exception:
    """
    ``error``, kept in the report, without its tracebacks and those of the errors it chains: their
    frames would hold the refused attempt's records, a chunk's worth for each rejected row.
    """
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


class ChunkSettings:
    """What every chunk unit of a call shares: where and how it writes, and what it does with a bad row."""

    __slots__ = ("dialect", "journal", "keys", "raise_first", "references", "table", "writer")

    def __init__(
        self,
        target: LoadTarget,
        writer: BulkWriter,
        journal: Any,
        dialect: Dialect,
        keys: KeyCheck | None,
        references: ReferenceCheck | None = None,
        *,
        raise_first: bool,
    ) -> None:
        self.table = target.table
        self.writer = writer
        #: The call's ``JournalRows``, or None.
        self.journal = journal
        #: The database's facts: what each chunk's transaction runs first.
        self.dialect = dialect
        #: The table's unique keys, checked before a chunk once a duplicate was refused; or None.
        self.keys = keys
        #: The table's foreign keys, checked before a chunk once a row was refused for one; or None.
        self.references = references
        self.raise_first = raise_first


class ChunkUnit:
    """A unit that writes one chunk in its session's transaction."""

    __slots__ = ("aside", "checked", "chunk", "references_checked", "settings")

    def __init__(self, chunk: Chunk, settings: ChunkSettings) -> None:
        self.chunk = chunk
        self.settings = settings
        #: Whether the chunk's keys were checked, and its references.
        self.checked = False
        self.references_checked = False
        #: The rows set aside at the chunk's end by the check: alone again in a retried transaction.
        self.aside = 0

    def _refused(self, search: RowSearch, attempt: Attempt, statement: Attempt, refusal: Refused) -> bool:
        """
        Tell ``search`` that ``statement``, of ``attempt``'s rows, was refused; or return True: the
        chunk's first attempt was refused for a duplicate key, and the chunk checks its keys and starts again.
        """
        offset = None if refusal.line is None else statement.offset(refusal.line)
        if self.settings.raise_first:
            if offset is None and attempt.rows == 1:
                offset = attempt.spans[0][0]
            if offset is not None:  # the first refused row: found without a search
                chunk = self.chunk
                raise FirstRefused(RejectedRow(chunk.indexes[offset], chunk.rows[offset], refusal.error))
        chunk = self.chunk
        whole = len(chunk.runs) == 1 and attempt.rows == len(chunk.rows)  # nothing written nor refused yet
        keys = self.settings.keys
        if keys is not None and is_duplicate_key(refusal.error):
            keys.arm(refusal.error)
            if not self.checked and whole and search.sent == attempt.rows:
                return True
        references = self.settings.references
        if references is not None and references.arm(refusal.error) and not self.references_checked and whole:
            return True
        search.refused(attempt, _without_tracebacks(refusal.error), offset)
        return False

    def _queries(self) -> list[tuple[KeyQuery, dict[str, Any]]] | None:
        """The statements that check the chunk's keys, if the load met a duplicate key; else None."""
        keys, chunk = self.settings.keys, self.chunk
        if keys is None or not keys.armed or len(chunk.runs) != 1 or self.checked:
            return None
        self.checked = True
        return [
            (query, parameters)
            for query in keys.queries(chunk.runs[0][0])
            for parameters in query.parameters(chunk.data)
        ]

    def _reference_queries(self) -> list[tuple[str, KeyQuery | MissingQuery, dict[str, Any]]] | None:
        """The statements that ask for the chunk's parent rows, if the load met a missing one; else None."""
        references, chunk = self.settings.references, self.chunk
        if references is None or not references.armed or len(chunk.runs) != 1 or self.references_checked:
            return None
        self.references_checked = True
        return [
            (name, query, parameters)
            for name, query in references.queries(chunk.runs[0][0])
            for parameters in query.parameters(chunk.data)
        ]

    def _reject_missing(self, found: list[tuple[str, KeyQuery | MissingQuery, Sequence[Any]]]) -> None:
        """Reject the rows whose parent ``found`` (each query's result rows) does not hold."""
        references = self.settings.references
        assert references is not None
        refused = references.missing(self.chunk.data, found)
        if refused:
            self.chunk.reject(refused)

    def _set_aside(self, found: list[tuple[KeyQuery, Sequence[Any]]]) -> int:
        """
        Reject the rows whose key the table holds (``found``) by a key that decides; set aside those
        whose key the table or an earlier row has: how many.
        """
        chunk, keys = self.chunk, self.settings.keys
        assert keys is not None
        refused = keys.held(chunk.data, found)
        if refused:
            chunk.reject(refused)
        offsets = keys.repeated(chunk.data, found)
        keys.armed = keys.armed or bool(refused)  # rows rejected: the next chunk checks too
        if offsets:
            chunk.set_aside(offsets)
        self.aside = len(offsets)
        return self.aside

    def _check_failed(self, error: sa_exc.DBAPIError, *, references: bool = False) -> None:
        """A check's statement failed: it is not asked again in this load, unless the connection is lost."""
        if error.connection_invalidated:
            raise error
        if references:
            self.settings.references = None
        else:
            self.settings.keys = None


class AsyncChunkUnit(ChunkUnit):
    """A :class:`ChunkUnit` on an ``AsyncSession``."""

    __slots__ = ()

    def __call__(self, session: AsyncSession) -> Any:
        return self._write(session)

    async def _checks_async(self, connection: AsyncConnection) -> int:
        """Reject the rows that miss a parent, then set the rows of keys already held aside: how many."""
        queries = self._reference_queries()
        if queries:
            try:
                found = [
                    (name, query, (await connection.execute(query.statement, parameters)).all())
                    for name, query, parameters in queries
                ]
            except sa_exc.DBAPIError as error:
                self._check_failed(error, references=True)
                await self.settings.writer.rollback_async(connection)
            else:
                self._reject_missing(found)
        return await self._check_keys_async(connection)

    async def _check_keys_async(self, connection: AsyncConnection) -> int:
        """Set aside the chunk's rows of keys already held, if the load checks keys: how many."""
        queries = self._queries()
        if not queries:
            return self.aside
        try:
            found = [
                (query, (await connection.execute(query.statement, parameters)).all())
                for query, parameters in queries
            ]
        except sa_exc.DBAPIError as error:
            self._check_failed(error)
            await self.settings.writer.rollback_async(connection)
            return 0
        return self._set_aside(found)

    async def _write(self, session: AsyncSession) -> ChunkResult:
        settings, chunk = self.settings, self.chunk
        connection = await session.connection()
        prepare = settings.dialect.load_prepare_sql((await connection.get_raw_connection()).driver_connection)
        if prepare is not None:
            await connection.exec_driver_sql(prepare)
        writer, table = settings.writer, settings.table
        await writer.savepoint_async(connection, again=False)
        search = RowSearch(len(chunk.rows), alone=await self._checks_async(connection))
        # Any other error ends the unit: its whole transaction is rolled back, savepoint and all.
        while (attempt := search.next()) is not None:
            for shape, statement, records in chunk.statements(attempt):
                try:
                    await writer.write_async(connection, table, shape.names, records)
                except Refused as refusal:
                    await writer.rollback_async(connection)
                    if self._refused(search, attempt, statement, refusal):  # start again, keys checked
                        alone = await self._checks_async(connection)
                        search = RowSearch(len(chunk.rows), alone, sent=search.sent)
                    break
            else:
                search.loaded(attempt)
                if not search.done:
                    await writer.savepoint_async(connection, again=True)
        result, keys = chunk.result(search, settings.journal)
        if keys:
            await settings.journal.write_many_async(session, keys)
        return result


class SyncChunkUnit(ChunkUnit):
    """A :class:`ChunkUnit` on a sync ``Session``, in a worker thread."""

    __slots__ = ()

    def _checks_sync(self, connection: Connection) -> int:
        """As :meth:`AsyncChunkUnit._checks_async`, on a sync connection."""
        queries = self._reference_queries()
        if queries:
            try:
                found = [
                    (name, query, connection.execute(query.statement, parameters).all())
                    for name, query, parameters in queries
                ]
            except sa_exc.DBAPIError as error:
                self._check_failed(error, references=True)
                self.settings.writer.rollback_sync(connection)
            else:
                self._reject_missing(found)
        return self._check_keys_sync(connection)

    def _check_keys_sync(self, connection: Connection) -> int:
        """As :meth:`AsyncChunkUnit._check_keys_async`, on a sync connection."""
        queries = self._queries()
        if not queries:
            return self.aside
        try:
            found = [
                (query, connection.execute(query.statement, parameters).all())
                for query, parameters in queries
            ]
        except sa_exc.DBAPIError as error:
            self._check_failed(error)
            self.settings.writer.rollback_sync(connection)
            return 0
        return self._set_aside(found)

    def __call__(self, session: Session) -> ChunkResult:
        settings, chunk = self.settings, self.chunk
        connection = session.connection()
        prepare = settings.dialect.load_prepare_sql(connection.connection.driver_connection)
        if prepare is not None:
            connection.exec_driver_sql(prepare)
        writer, table = settings.writer, settings.table
        writer.savepoint_sync(connection, again=False)
        search = RowSearch(len(chunk.rows), alone=self._checks_sync(connection))
        # Any other error ends the unit: its whole transaction is rolled back, savepoint and all.
        while (attempt := search.next()) is not None:
            for shape, statement, records in chunk.statements(attempt):
                try:
                    writer.write_sync(connection, table, shape.names, records)
                except Refused as refusal:
                    writer.rollback_sync(connection)
                    if self._refused(search, attempt, statement, refusal):  # start again, keys checked
                        alone = self._checks_sync(connection)
                        search = RowSearch(len(chunk.rows), alone, sent=search.sent)
                    break
            else:
                search.loaded(attempt)
                if not search.done:
                    writer.savepoint_sync(connection, again=True)
        result, keys = chunk.result(search, settings.journal)
        if keys:
            settings.journal.write_many_sync(session, keys)
        return result
