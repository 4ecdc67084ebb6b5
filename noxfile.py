"""Sessions: tests, lint, mypy, docs, bench. `python3 -m nox -s tests` is the README's test command."""

from __future__ import annotations

import os
import shutil
import subprocess

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "lint", "mypy", "docs"]


def _mysqlclient_builds() -> bool:
    """Whether mysqlclient can build here: pkg-config finds a MySQL or MariaDB client library."""
    pkg_config = shutil.which("pkg-config")
    return pkg_config is not None and any(
        subprocess.run([pkg_config, "--exists", library], check=False).returncode == 0
        for library in ("mysqlclient", "libmariadb")
    )


def _install_mysqlclient(session: nox.Session) -> None:
    """mysqlclient (MySQLdb) where it builds: tests/test_mysqldb.py and the threads-mysqldb row need it."""
    if _mysqlclient_builds():
        session.install("mysqlclient>=2.2")
    else:
        session.log("mysqlclient cannot build here (no libmariadb-dev or pkg-config): its tests will skip")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on the real PostgreSQL (or an embedded one) and SQLite, with coverage."""
    session.install("-e", ".[test]")
    _install_mysqlclient(session)
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
    _install_mysqlclient(session)
    if not os.path.exists("benchmarks/__main__.py"):
        session.log("The benchmark suite lands with the benchmarks issue; nothing to run yet.")
        return
    session.run("python", "-m", "benchmarks", *session.posargs)
