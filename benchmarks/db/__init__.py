"""
The database servers the suite runs on: set-up, schemas, engines, and what the sampler reads.

:mod:`.postgresql` (the default; a throw-away embedded server when none answers) and :mod:`.mysql`
(``--database mysql``) offer the same attributes and methods; :mod:`.schema` has the post's
tables, :mod:`.sampler` the connection sampler, :mod:`.proc` the /proc readers behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from sqlalchemy import URL

if TYPE_CHECKING:
    from .mysql import MySQLDatabase
    from .postgresql import Database

#: The server a run uses: PostgreSQL or MySQL/MariaDB.
Server: TypeAlias = "Database | MySQLDatabase"


@dataclass
class ServerFacts:
    """What a run records of its server, whichever it is: where it is, how it was chosen, its size."""

    url: URL
    source: str
    server_version: str = ""
    max_connections: int = 0
    local: bool = True

    @property
    def shown(self) -> str:
        """The URL with any password hidden, safe to print and store."""
        return self.url.render_as_string(hide_password=True)
