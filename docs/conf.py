"""Sphinx configuration for boundeddb."""

from __future__ import annotations

import zlib
from importlib.metadata import version as _version
from pathlib import Path

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
exclude_patterns = ["_build", "inventories"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True


# The runners import rich's Progress for type checkers only (rich is an optional extra, imported
# only when a call asks for a bar), so autodoc, which evaluates their signatures' annotations in
# their modules, would not find it: give those modules the name for the build.
def _give_progress_to_the_runners() -> None:
    import importlib
    import pkgutil

    from rich.progress import Progress

    from boundeddb import _runners

    # Every module of the runners, so that a verb that moves to a module of its own keeps its signature.
    for info in pkgutil.iter_modules(_runners.__path__):
        module = importlib.import_module(f"{_runners.__name__}.{info.name}")
        module.Progress = Progress  # type: ignore[attr-defined]


_give_progress_to_the_runners()
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "boundeddb"
html_static_path = ["_static"]
html_css_files = ["custom.css"]


# -- Intersphinx, offline -------------------------------------------------------------------------
# This machine and CI reach package registries only, never docs.python.org and friends, so the
# inventories of the projects we link to are kept as plain text in docs/inventories/ (one object a
# line, with its real location in that project's docs) and compressed here into the objects.inv
# format that intersphinx reads. Add a line there when a page refers to a new outside object.

_HERE = Path(__file__).parent
_INVENTORIES = {
    # name: (project, version, docs root)
    "python": ("Python", "3", "https://docs.python.org/3/"),
    "sqlalchemy": ("SQLAlchemy", "2.0", "https://docs.sqlalchemy.org/en/20/"),
    "anyio": ("AnyIO", "4", "https://anyio.readthedocs.io/en/stable/"),
    "rich": ("Rich", "13", "https://rich.readthedocs.io/en/stable/"),
    "distributed": ("Dask.distributed", "2024", "https://distributed.dask.org/en/stable/"),
}


def _write_inventory(name: str, project_name: str, project_version: str) -> str:
    """Compress docs/inventories/<name>.txt into a Sphinx v2 objects.inv; return its path."""
    lines = [
        line.strip()
        for line in (_HERE / "inventories" / f"{name}.txt").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project_name}\n"
        f"# Version: {project_version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    target = _HERE / "_build" / "inventories" / f"{name}.inv"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(header.encode() + zlib.compress(("\n".join(lines) + "\n").encode()))
    return str(target)


intersphinx_mapping = {
    name: (root.rstrip("/"), _write_inventory(name, project_name, project_version))
    for name, (project_name, project_version, root) in _INVENTORIES.items()
}

nitpicky = True
nitpick_ignore = [
    # TypeVars of the private boundeddb._typevars module appear in signatures (RunReport[T]); they are
    # type parameters, not objects with a page of their own, so there is nothing to link to.
    ("py:class", "boundeddb._typevars.T"),
    ("py:class", "boundeddb._typevars.ItemT"),
    ("py:class", "T"),
    # boundeddb.instrument()'s parameters: OpenTelemetry's provider interfaces, imported for type
    # checkers only (opentelemetry-api is an optional dependency), so Sphinx sees the bare names.
    ("py:class", "MeterProvider"),
    ("py:class", "TracerProvider"),
]
