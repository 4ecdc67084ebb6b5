"""
What a run records of its database server, whichever kind it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import URL


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
