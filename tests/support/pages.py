"""The code blocks of README.md and docs/ pages, and the examples' URLs pointed at the test server."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import URL

from boundeddb.testing import PostgresServer, driver_url

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The URLs the examples are written with, whatever the driver.
EXAMPLE_URL = re.compile(
    r"postgresql(?:\+(?P<driver>asyncpg|psycopg2|psycopg))?://postgres@127\.0\.0\.1(?::5432)?/test"
)
NOT_RUN = re.compile(r"^# docs: not-run \((?P<reason>[^)]+)\)$")
FENCE_OPEN = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?:\{code-block\}\s*)?(?P<lang>[\w+-]*)\s*(?P<rest>.*)$")


@dataclass
class Block:
    """One fenced code block of a page."""

    line: int
    language: str
    code: str
    directive: bool = False
    options: dict[str, str] = field(default_factory=dict)

    @property
    def not_run_reason(self) -> str | None:
        """The reason given by a ``# docs: not-run (reason)`` first line, if there is one."""
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        match = NOT_RUN.match(first)
        return match["reason"] if match else None

    @property
    def file_name(self) -> str | None:
        """The file this block is, if it is a code-block with a ``.py`` caption."""
        caption = self.options.get("caption", "")
        return caption if self.directive and caption.endswith(".py") else None


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order (nested fences are not supported)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE_OPEN.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, start = opening["fence"], index
        directive = "{code-block}" in lines[index]
        index += 1
        options: dict[str, str] = {}
        while directive and index < len(lines) and lines[index].startswith(":"):
            name, _, value = lines[index][1:].partition(":")
            options[name.strip()] = value.strip()
            index += 1
        body: list[str] = []
        while index < len(lines) and lines[index].strip() != fence:
            body.append(lines[index])
            index += 1
        index += 1  # the closing fence
        blocks.append(Block(start + 1, opening["lang"], "\n".join(body) + "\n", directive, options))
    return blocks


def python_blocks(path: Path) -> list[Block]:
    """The Python blocks of a page."""
    return [block for block in blocks_of(path) if block.language in ("python", "py", "python3")]


def with_test_server(code: str, server: PostgresServer) -> str:
    """Replace the examples' URLs with the test server's (same driver), password included."""

    def replace(match: re.Match[str]) -> str:
        driver = match["driver"]
        url: URL = driver_url(server.url, driver) if driver else server.url
        return url.render_as_string(hide_password=False)

    return EXAMPLE_URL.sub(replace, code)
