"""The layers' imports: the core runs on anyio alone, without SQLAlchemy."""

from __future__ import annotations

import subprocess
import sys

# ``import boundeddb._core`` runs the package's __init__ first, which imports the runners (and so
# SQLAlchemy): the child stands a bare ``boundeddb`` package in for it, then imports every module
# of the core, and everything they import, as the core's own tests do.
CORE_ONLY = """
import importlib, importlib.util, pkgutil, sys, types

package = types.ModuleType("boundeddb")
package.__path__ = list(importlib.util.find_spec("boundeddb").submodule_search_locations)
sys.modules["boundeddb"] = package
core = importlib.import_module("boundeddb._core")
for module in pkgutil.iter_modules(core.__path__):
    importlib.import_module(f"boundeddb._core.{module.name}")
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "sqlalchemy")
assert not loaded, f"the core loaded SQLAlchemy: {loaded[:3]}"
"""


def test_the_core_imports_no_sqlalchemy() -> None:
    """Every module of boundeddb._core imports, with what it imports, in a process without SQLAlchemy."""
    done = subprocess.run([sys.executable, "-c", CORE_ONLY], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
