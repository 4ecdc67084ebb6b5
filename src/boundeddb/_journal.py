"""Journal: a job's record, kept in the runner's own database, of the items whose units committed."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, overload

from sqlalchemy import Column, DateTime, MetaData, String, Table, func
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateTable
from sqlalchemy.types import TypeDecorator, TypeEngine

from ._typevars import ItemT

__all__ = ["DEFAULT_TABLE", "KEY_LENGTH", "Journal", "journal_table"]

#: The table every job's journal is kept in, unless ``Journal(table=...)`` names another.
DEFAULT_TABLE = "boundeddb_journal"
#: The most characters of a job's name and of a key: both are the table's primary key.
KEY_LENGTH = 255


class _TextAsBytes(mysql.VARBINARY):
    """``VARBINARY`` in the DDL, bound as text: the server converts it to the column's bytes."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None


class ExactText(TypeDecorator[str]):
    """
    Text compared byte for byte on every database: a key names one item, whatever its case or spaces.

    MySQL's and MariaDB's text collations compare ``"a"``, ``"A"`` and ``"a "`` equal: there the
    column is ``VARBINARY``, the text's UTF-8 bytes. The key is still bound as text, in the
    connection's ``utf8mb4``, and compared as bytes: aiomysql cannot bind ``bytes`` with PyMySQL 2.
    """

    impl = String(KEY_LENGTH)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(_TextAsBytes(4 * KEY_LENGTH))
        return dialect.type_descriptor(String(KEY_LENGTH))

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if isinstance(value, (bytes, bytearray)):
            return value.decode()
        return value  # type: ignore[no-any-return]


_tables: dict[str, Table] = {}
_tables_lock = threading.Lock()


def journal_table(name: str) -> Table:
    """The journal table named ``name``: ``(job, item_key)`` its primary key."""
    with _tables_lock:
        table = _tables.get(name)
        if table is None:
            table = _tables[name] = Table(
                name,
                MetaData(),
                Column("job", ExactText(), primary_key=True),
                Column("item_key", ExactText(), primary_key=True),
                Column("committed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
            )
        return table


def _check_name(value: object, argument: str, example: str) -> str:
    if not isinstance(value, str) or not value:
        msg = f"{argument} must be a non-empty str, got {value!r}: pass e.g. {example}"
        raise TypeError(msg)
    if len(value) > KEY_LENGTH:
        msg = f"{argument} must be at most {KEY_LENGTH} characters, got {len(value)}: {value[:40]!r}..."
        raise ValueError(msg)
    return value


class Journal(Generic[ItemT]):
    """
    A job's record of the items whose units committed, so that running the job again skips them.

    Pass it to ``map()``: each item's unit writes the row ``(job, key(item))`` in its own
    transaction, so the row commits if and only if the unit's writes do. Run the same ``map()``
    with the same journal after a crash, or after ``errors="collect"`` left failures, and every
    item whose unit committed is skipped with an :attr:`Outcome.skipped <boundeddb.Outcome.skipped>`
    outcome. So each item's database effects happen exactly once across any number of crashes and
    reruns, also for units that are not idempotent. :doc:`/how-to/journal` shows a job resumed,
    and :doc:`/explanation/guarantees` where exactly once ends.

    ::

        journal = Journal("recompute-balances", key=lambda account: account.id)
        report = await runner.map(recompute, accounts, journal=journal)

    Args:
        job: The job's name, at most 255 characters. Runs of one job share their journal rows.
        key: ``key(item)`` names each item within the job: a ``str`` of at most 255 characters, or
            an ``int``. Keys must be unique within a run. ``1`` and ``"1"`` are the same key.
            ``map()`` needs it; ``load()`` names rows by their input index and takes a journal
            without one. *Optional since 0.3.0's load().*
        table: The table the rows are kept in. Jobs may share one.
        create_table: Create the table at the first ``map()`` if it does not exist. Pass ``False``
            where the schema is managed by migrations: :meth:`ddl` prints the statement.

    .. versionadded:: 0.3.0
    """

    __slots__ = ("_create_table", "_job", "_key", "_table")

    def __init__(
        self,
        job: str,
        *,
        key: Callable[[ItemT], str | int] | None = None,
        table: str = DEFAULT_TABLE,
        create_table: bool = True,
    ) -> None:
        self._job = _check_name(job, "Journal(job=...)", '"recompute-balances"')
        key_fn: object = key
        if key_fn is not None and not callable(key_fn):
            msg = (
                f"Journal(key=...) must be a function of the item, got {key!r}: "
                "pass e.g. key=lambda item: item.id"
            )
            raise TypeError(msg)
        self._key = key
        self._table = journal_table(_check_name(table, "Journal(table=...)", f'"{DEFAULT_TABLE}"'))
        create: object = create_table
        if not isinstance(create, bool):
            msg = f"Journal(create_table=...) must be True or False, got {create_table!r}"
            raise TypeError(msg)
        self._create_table = create_table

    @property
    def job(self) -> str:
        """The job's name."""
        return self._job

    @property
    def key(self) -> Callable[[ItemT], str | int] | None:
        """The function that names each item within the job, or None for a ``load()``'s journal."""
        return self._key

    @property
    def table(self) -> str:
        """The name of the table the journal is kept in."""
        return self._table.name

    @property
    def create_table(self) -> bool:
        """Whether the first ``map()`` creates the table if it does not exist."""
        return self._create_table

    def __repr__(self) -> str:
        return f"Journal({self._job!r}, table={self._table.name!r})"

    # -- the table -----------------------------------------------------------------------------

    @staticmethod
    def ddl(engine: Engine | AsyncEngine, *, table: str = DEFAULT_TABLE) -> str:
        """
        The ``CREATE TABLE`` statement of the journal table on ``engine``'s database.

        For a migration (Alembic's ``op.execute()``), or for a database administrator.
        """
        sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
        name = _check_name(table, "table", f'"{DEFAULT_TABLE}"')
        ddl = str(CreateTable(journal_table(name)).compile(dialect=sync_engine.dialect))
        lines = [line.rstrip().replace("\t", "    ") for line in ddl.strip().splitlines()]
        return "\n".join(lines) + ";"

    @overload
    @staticmethod
    def create(engine: Engine, *, table: str = DEFAULT_TABLE) -> None: ...

    @overload
    @staticmethod
    def create(engine: AsyncEngine, *, table: str = DEFAULT_TABLE) -> Awaitable[None]: ...

    @staticmethod
    def create(engine: Engine | AsyncEngine, *, table: str = DEFAULT_TABLE) -> Awaitable[None] | None:
        """
        Create the journal table if it does not exist.

        With an :class:`~sqlalchemy.ext.asyncio.AsyncEngine`, await the result.
        """
        created = journal_table(_check_name(table, "table", f'"{DEFAULT_TABLE}"'))

        def create(connection: Connection) -> None:
            created.create(connection, checkfirst=True)

        created_now: Awaitable[None] | None = _in_transaction(engine, create)
        return created_now

    @overload
    def forget(self, engine: Engine) -> int: ...

    @overload
    def forget(self, engine: AsyncEngine) -> Awaitable[int]: ...

    def forget(self, engine: Engine | AsyncEngine) -> int | Awaitable[int]:
        """
        Delete this job's rows, so that its next run runs every item again. Returns how many.

        Where the table does not exist yet, there is nothing to forget: 0.
        With an :class:`~sqlalchemy.ext.asyncio.AsyncEngine`, await the result.
        """
        table, job = self._table, self._job

        def forget(connection: Connection) -> int:
            if not sa_inspect(connection).has_table(table.name):
                return 0
            return int(connection.execute(table.delete().where(table.c.job == job)).rowcount)

        forgotten: int | Awaitable[int] = _in_transaction(engine, forget)
        return forgotten


EngineT = TypeVar("EngineT", Engine, AsyncEngine)


def untranslated(engine: EngineT) -> EngineT:
    """
    ``engine`` (sharing its pool), set to find the journal table in the default schema whatever its
    ``schema_translate_map`` says: a unit's row goes to the driver as plain SQL, which no map moves.
    """
    return engine.execution_options(schema_translate_map=None)


def _in_transaction(engine: object, work: Callable[[Connection], Any]) -> Any:
    """``work(connection)`` in a transaction on ``engine``: done now, or an awaitable for an AsyncEngine."""
    if isinstance(engine, AsyncEngine):

        async def run() -> Any:
            async with untranslated(engine).begin() as connection:
                return await connection.run_sync(work)

        return run()
    if isinstance(engine, Engine):
        with untranslated(engine).begin() as connection:
            return work(connection)
    msg = f"engine must be a sqlalchemy Engine or AsyncEngine, got {type(engine).__name__}"
    raise TypeError(msg)
