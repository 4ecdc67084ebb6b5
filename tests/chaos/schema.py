"""
The soak's tables, in its own database on its own server (and in a database of its own on MariaDB).

None has a unique key on what the checker counts: a write done twice must show as two rows, not be
refused as a duplicate.
"""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, Table, Text, text
from sqlalchemy.engine import Engine

__all__ = ["LOADED", "METADATA", "create_bank", "create_mysql", "create_postgres"]

METADATA = MetaData()

#: The rows of every ``load()`` job: ``(job, i)`` once each when the job is done.
LOADED = Table(
    "chaos_loaded",
    METADATA,
    Column("job", Text, nullable=False),
    Column("i", Integer, nullable=False),
    Column("payload", Text, nullable=False),
)

_POSTGRES = [
    "CREATE TABLE chaos_writes (id bigserial PRIMARY KEY, op text NOT NULL, at timestamptz DEFAULT now())",
    "CREATE INDEX ON chaos_writes (op)",
    "CREATE TABLE chaos_accounts (id integer PRIMARY KEY, balance bigint NOT NULL)",
    "CREATE TABLE chaos_transfers (id bigserial PRIMARY KEY, op text NOT NULL, source integer NOT NULL, "
    "target integer NOT NULL, amount integer NOT NULL)",
    "CREATE INDEX ON chaos_transfers (op)",
    "CREATE TABLE chaos_counters (job text NOT NULL, item integer NOT NULL, n integer NOT NULL, "
    "PRIMARY KEY (job, item))",
    "CREATE TABLE chaos_noise (id bigserial PRIMARY KEY, at timestamptz DEFAULT now())",
]


def create_postgres(engine: Engine) -> None:
    """Every table of the soak, and the chaos_loaded table of ``load()``, in ``engine``'s database."""
    with engine.begin() as connection:
        for statement in _POSTGRES:
            connection.execute(text(statement))
        METADATA.create_all(connection)
        connection.execute(text("CREATE INDEX ON chaos_loaded (job, i)"))


def create_bank(engine: Engine, accounts: int, balance: int) -> None:
    """``accounts`` accounts of ``balance`` each."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO chaos_accounts (id, balance) SELECT g, :b FROM generate_series(0, :n - 1) AS g"
            ),
            {"b": balance, "n": accounts},
        )


def create_mysql(engine: Engine) -> None:
    """The writes table on MariaDB."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "CREATE TABLE chaos_writes (id BIGINT AUTO_INCREMENT PRIMARY KEY, op VARCHAR(100) NOT NULL, "
                "INDEX (op)) ENGINE=InnoDB"
            )
        )
