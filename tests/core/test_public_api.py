"""The public face: a sorted __all__ that matches the module, public __module__s, py.typed, version."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import inspect

import pytest

import boundeddb
import boundeddb.testing


def public_names(module: object) -> set[str]:
    """Names a user would take for public API: no leading underscore, no submodules."""
    return {
        name
        for name, obj in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(obj) and name != "annotations"
    }


def test_all_is_sorted() -> None:
    """__all__ is sorted, so that a diff shows what was added or removed."""
    assert boundeddb.__all__ == sorted(boundeddb.__all__)
    assert len(set(boundeddb.__all__)) == len(boundeddb.__all__)


def test_all_equals_the_public_names_of_the_module() -> None:
    """Everything public-looking in `boundeddb` is in __all__, and everything in __all__ exists."""
    # __init__.py imports `version` and `PackageNotFoundError` from importlib.metadata under their
    # own names, so `boundeddb.version` looks like API; import them as `_version` (or inside a
    # module __getattr__, as stamina does) to keep the public face thin.
    assert set(boundeddb.__all__) == public_names(boundeddb) | {"__version__"}


@pytest.mark.parametrize("name", [name for name in boundeddb.__all__ if name != "__version__"])
def test_exported_objects_have_the_public_module(name: str) -> None:
    """Reprs, tracebacks, pickles and the docs show `boundeddb.X`, not the private module."""
    obj = getattr(boundeddb, name)
    assert inspect.isclass(obj) or inspect.isfunction(obj)
    assert obj.__module__ == "boundeddb"
    assert getattr(boundeddb, obj.__qualname__) is obj


def test_py_typed_ships() -> None:
    """The package carries the PEP 561 marker, so type checkers use its annotations."""
    assert importlib.resources.files("boundeddb").joinpath("py.typed").is_file()


def test_version_comes_from_the_package_metadata() -> None:
    """__version__ is the installed distribution's version, not a hard-coded string."""
    assert isinstance(boundeddb.__version__, str)
    assert boundeddb.__version__ == importlib.metadata.version("boundeddb")


def test_testing_all_names_exist() -> None:
    """Every name in boundeddb.testing.__all__ exists, and the list is sorted."""
    assert boundeddb.testing.__all__ == sorted(boundeddb.testing.__all__)
    missing = [name for name in boundeddb.testing.__all__ if not hasattr(boundeddb.testing, name)]
    assert missing == []
