"""Sphinx configuration for boundeddb."""

from __future__ import annotations

from importlib.metadata import version as _version

project = "boundeddb"
author = "boundeddb developers"
copyright = "2026, boundeddb developers"
release = _version("boundeddb")
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.doctest",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "boundeddb"

# This machine (and CI) reach no documentation sites, so external inventories cannot be fetched.
# Our own references are checked nitpickily; references into other projects' docs are not.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(sqlalchemy|anyio|asyncio|trio|typing|typing_extensions|collections|builtins)\..*"),
    (r"py:.*", r"(AsyncSession|Session|async_sessionmaker|sessionmaker|Engine|URL|Pool)"),
    (r"py:.*", r"(boundeddb\._typing\.)?(T|ItemT|T_co|MakerT|ErrorsMode|Driver|AsyncUnit|SyncUnit|Units)"),
    (r"py:exc", r"(TypeError|ValueError|RuntimeError|TimeoutError|KeyboardInterrupt|Exception)"),
    (r"py:class", r"(Exception|BaseException|ExceptionGroup|TimeoutError|RuntimeError|TypeError)"),
    (r"py:class", r"(Self|bool|int|float|str|None)"),
]
