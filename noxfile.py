"""Sessions: tests, lint, mypy, docs, bench. `python3 -m nox -s tests` is the README's test command."""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "lint", "mypy", "docs"]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on the real PostgreSQL (or an embedded one) and SQLite, with coverage."""
    session.install("-e", ".[test]")
    session.run("coverage", "run", "-m", "pytest", *session.posargs, env={"COVERAGE_FILE": ".coverage"})
    session.run("coverage", "report")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the package, tests, benchmarks and docs."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def mypy(session: nox.Session) -> None:
    """mypy --strict on the package, and on tests/typing/api.py (type-checked, never run)."""
    session.install("-e", ".[test]", "mypy>=1.11")
    session.run("mypy", "--strict", "src")
    if os.path.exists("tests/typing/api.py"):
        session.run("mypy", "--strict", "tests/typing/api.py")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs with warnings as errors and nitpicky references."""
    session.install("-e", ".[docs]")
    session.run("sphinx-build", "-W", "-n", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmark suite (the project's main job); pass options after `--`."""
    session.install("-e", ".[bench]")
    if not os.path.exists("benchmarks/__main__.py"):
        session.log("The benchmark suite lands with the benchmarks issue; nothing to run yet.")
        return
    session.run("python", "-m", "benchmarks", *session.posargs)
