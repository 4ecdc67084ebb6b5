"""
The database servers the suite runs on: set-up, schemas, engines, and what the sampler reads.

:mod:`.postgresql` (the default; a throw-away embedded server when none answers) and :mod:`.mysql`
(``--database mysql``) offer the same attributes and methods, those of :mod:`.facts` among them;
:mod:`.schema` has the post's tables, :mod:`.sampler` the connection sampler, :mod:`.proc` the
/proc readers behind it, and :mod:`.pgbouncer` a PgBouncer in front of the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from .mysql import MySQLDatabase
    from .postgresql import Database

#: The server a run uses: PostgreSQL or MySQL/MariaDB.
Server: TypeAlias = "Database | MySQLDatabase"
