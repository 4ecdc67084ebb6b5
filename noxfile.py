"""
Sessions: tests, package, lint, mypy, docs, bench, soak, chaos. `python3 -m nox -s tests` is the README's test
command.

`tests` runs on every Python the classifiers claim whose interpreter nox finds (`python3.X` on
PATH; with pyenv, name them all: `PYENV_VERSION=3.11.7:3.10.13:3.12.1:3.13.0`, as .ci/run does),
and skips the others; `nox -s tests-3.12` runs one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
# uv, unlike pip, installs without compiling bytecode, and where PYTHONDONTWRITEBYTECODE is set (as on
# CI's machine) nothing ever writes it: every process the tests and benchmarks start (a spawned worker,
# a killed job, a docs example) then compiled SQLAlchemy anew, 1.8 s of CPU to import boundeddb instead
# of 0.5 s. Compile at install.
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")
nox.options.reuse_existing_virtualenvs = True
nox.options.download_python = "never"  # test the Pythons this machine has, never a downloaded one
nox.options.sessions = ["tests", "package", "lint", "mypy", "docs"]

#: The Pythons the classifiers in pyproject.toml claim (`nox -s package` checks that the two agree).
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]

# -- Test paths: every list of test files that a session or .ci/run names, in this one place ----------

#: The runner contract, the core's in-memory tests, ProcessRunner (spawned workers, pickling) and
#: Ctrl-C in the *_sync verbs (asyncio's runner differs by version): what .ci/run runs on each Python
#: other than 3.11, which runs the whole suite.
CORE_TESTS = [
    "tests/runners/test_contract.py",
    "tests/core",
    "tests/runners/test_process_runner.py",
    "tests/faults/test_ctrl_c.py",
]
#: What `nox -s package` runs from the unpacked sdist against the wheel installed on its own: the
#: public face (every name, __version__ from the metadata, py.typed shipped). The runner contract
#: runs on every Python already; on the wheel it added 5-10 minutes to CI for no new failure mode.
WHEEL_TESTS = ["tests/core/test_public_api.py"]
#: .ci/run's slice with no PostgreSQL in reach (`unshare -n`): the embedded server's path.
NO_SERVER_TESTS = [
    "tests/runners/test_contract.py",
    "tests/runners/test_cancellation.py",
    "tests/stacks/test_embedded_server.py",
]
#: .ci/run's slice through PgBouncer in front of the embedded server.
PGBOUNCER_TESTS = ["tests/stacks/test_pgbouncer.py"]
#: What `nox -s soak` repeats: the cancellation and fault tests, on PostgreSQL and MariaDB
#: (tests/faults/test_cancel_leaves_no_transaction.py among them), and what a cancelled submit()
#: tells its caller. Never in CI: one round of the quick ones takes about 2 minutes here, so 30
#: rounds take an hour.
SOAK_TESTS = ["tests/runners/test_cancellation.py", "tests/runners/test_submit_cancel.py", "tests/faults"]

#: What the sdist must hold (as a prefix of each member's path within its top folder), and what it
#: must not; the wheel must hold the package, py.typed and LICENSE.
SDIST_HAS = ["src/boundeddb/__init__.py", "src/boundeddb/py.typed", "tests/", "docs/conf.py", "LICENSE",
             "README.md", "CHANGELOG.md", "pyproject.toml", "PKG-INFO"]  # fmt: skip
SDIST_HAS_NOT = ["benchmarks/", ".ci/", "noxfile.py", "docs/_build/", ".venv/", ".nox/", "dist/"]
WHEEL_HAS = ["boundeddb/__init__.py", "boundeddb/py.typed", "boundeddb-{version}.dist-info/licenses/LICENSE"]


def _mysqlclient_builds() -> bool:
    """Whether mysqlclient can build here: pkg-config finds a MySQL or MariaDB client library."""
    pkg_config = shutil.which("pkg-config")
    return pkg_config is not None and any(
        subprocess.run([pkg_config, "--exists", library], check=False).returncode == 0
        for library in ("mysqlclient", "libmariadb")
    )


def _install_mysqlclient(session: nox.Session) -> None:
    """mysqlclient (MySQLdb) where it builds: tests/stacks/test_mysqldb.py and threads-mysqldb need it."""
    if _mysqlclient_builds():
        session.install("mysqlclient>=2.2")
    else:
        session.log("mysqlclient cannot build here (no libmariadb-dev or pkg-config): its tests will skip")


#: The serial group: the marker of the tests whose assertion needs an otherwise idle machine (the
#: auto limit's climb, rates compared, kill-and-restart timing). `nox -s tests` runs them alone, one
#: at a time, after the rest has run side by side.
SERIAL = "serial"
#: How many pytest-xdist workers run the rest side by side: most of a test's time is spent waiting
#: (on servers, child processes, timeouts), so more workers than the 2 cores pay (docs/how-to/contribute.md).
WORKERS = "4"


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """
    Run the test suite on the real PostgreSQL (or an embedded one), MariaDB and SQLite, with coverage:
    all but the serial group in WORKERS processes side by side (pytest-xdist), then the serial group
    alone. `-- <pytest arguments>` go to both parts (`-- tests/core`, `-- -k contract`, `-- -n 0`).
    """
    session.install("-e", ".[test]")
    _install_mysqlclient(session)
    # The tests' own modules and src/ compiled once, and pytest's rewritten test modules cached, even
    # where PYTHONDONTWRITEBYTECODE is set (an empty value unsets it): each worker and child process
    # would compile them again.
    # No COVERAGE_CORE=sysmon: on 3.12 and 3.13 sys.monitoring cannot measure branches (coverage warns,
    # and warnings are errors here); from 3.14 coverage uses it by itself.
    env = {"COVERAGE_FILE": ".coverage", "PYTHONDONTWRITEBYTECODE": ""}
    coverage = ["--cov", "--cov-report="]
    # Exit status 5 is "no tests collected": the arguments chose none of this part's tests.
    # worksteal: a worker whose share ran out takes tests from a busy one's (the suite's tests take from
    # a few ms to half a minute, so even shares end unevenly).
    side_by_side = ["-n", WORKERS, "--dist", "worksteal", "-m", f"not {SERIAL}"]
    session.run("pytest", *side_by_side, *coverage, *session.posargs, env=env, success_codes=[0, 5])
    alone = ["-m", SERIAL, *coverage, "--cov-append"]
    session.run("pytest", *alone, *session.posargs, "-n", "0", env=env, success_codes=[0, 5])
    session.run("coverage", "report", env=env)


def _version() -> str:
    match = re.search(r'^version = "([^"]+)"', Path("pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert match is not None, "pyproject.toml has no version"
    return match.group(1)


def readme_quickstart() -> str:
    """The README's first ```python block: the quickstart, as a user copies it."""
    readme = Path("README.md").read_text(encoding="utf-8")
    match = re.search(r"^```python\n(.*?)^```$", readme, re.M | re.S)
    assert match is not None, "README.md has no ```python block"
    return match.group(1)


def _check_claims(session: nox.Session) -> None:
    """The classifiers claim the Pythons that `tests` runs on, no more and no fewer."""
    claimed = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', Path("pyproject.toml").read_text())
    if claimed != PYTHONS:
        session.error(f"pyproject.toml's classifiers claim Python {claimed}, noxfile.PYTHONS tests {PYTHONS}")


def _check_artefacts(session: nox.Session, sdist: Path, wheel: Path, version: str) -> None:
    """The sdist and wheel hold what they must (LICENSE in both) and the sdist no junk."""
    with tarfile.open(sdist) as archive:
        top = f"boundeddb-{version}/"
        members = [name.removeprefix(top) for name in archive.getnames() if name.startswith(top)]
    missing = [want for want in SDIST_HAS if not any(m.startswith(want) for m in members)]
    junk = sorted(m for m in members if any(m.startswith(bad) for bad in SDIST_HAS_NOT) or "__pycache__" in m)
    if missing or junk:
        session.error(f"{sdist.name}: missing {missing}, should not ship {junk[:20]}")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    missing = [want for want in (w.format(version=version) for w in WHEEL_HAS) if want not in names]
    if missing:
        session.error(f"{wheel.name}: missing {missing}")
    session.log(f"{sdist.name}: {len(members)} files; {wheel.name}: {len(names)} files; LICENSE in both")


@nox.session(reuse_venv="never")
def package(session: nox.Session) -> None:
    """
    Build the sdist and wheel, check them (twine check --strict, their file lists), then install the
    wheel alone with pip in a new virtualenv and run the README quickstart with it (PostgreSQL at
    127.0.0.1, as the README has it), and WHEEL_TESTS from the unpacked sdist against it.
    """
    _check_claims(session)
    version = _version()
    dist = Path("dist")
    shutil.rmtree(dist, ignore_errors=True)
    session.install("build>=1.2", "twine>=6.1")
    session.run("python", "-m", "build", "--outdir", str(dist))
    sdist, wheel = dist / f"boundeddb-{version}.tar.gz", dist / f"boundeddb-{version}-py3-none-any.whl"
    session.run("twine", "check", "--strict", str(sdist), str(wheel))
    _check_artefacts(session, sdist, wheel, version)

    # A user's install: a stdlib venv, pip, the wheel and its dependencies only; nothing of the checkout.
    tmp = Path(session.create_tmp()).resolve()
    user = tmp / "user-venv"
    shutil.rmtree(user, ignore_errors=True)
    session.run("python", "-m", "venv", str(user))
    python = str(user / "bin" / "python")
    session.run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel.resolve()),
                external=True)  # fmt: skip
    work = tmp / "quickstart"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "quickstart.py").write_text(readme_quickstart(), encoding="utf-8")
    with session.chdir(work):
        session.run(python, "-c", _WHERE_FROM.format(version=version, venv=user), external=True)
        session.run(python, "quickstart.py", external=True)

    # The tests, as the sdist ships them, against the installed wheel (the sdist's src/ is not on
    # sys.path: pytest puts the tests' root there, which has no boundeddb/).
    session.run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                f"boundeddb[test] @ {wheel.resolve().as_uri()}", external=True)  # fmt: skip
    unpacked = tmp / "sdist"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    with session.chdir(unpacked / f"boundeddb-{version}"):
        session.run(python, "-c", _WHERE_FROM.format(version=version, venv=user), external=True)
        session.run(python, "-m", "pytest", "-q", *(session.posargs or WHEEL_TESTS), external=True)


_WHERE_FROM = """\
import boundeddb, pathlib
where = pathlib.Path(boundeddb.__file__).resolve()
assert where.is_relative_to(pathlib.Path("{venv}").resolve()), f"boundeddb imported from {{where}}"
assert boundeddb.__version__ == "{version}", boundeddb.__version__
print(f"boundeddb {{boundeddb.__version__}} from {{where.parent}}")
"""


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
def soak(session: nox.Session) -> None:
    """
    Run SOAK_TESTS, but the slow ones, BOUNDEDDB_SOAK times each (30 by default; tests/conftest.py
    repeats them), to catch what goes wrong once in many runs; `-- <pytest arguments>` chooses
    other tests or markers (`-- tests/faults -m slow`). Not in CI, nor among the default sessions.
    """
    session.install("-e", ".[test]")
    _install_mysqlclient(session)
    tests = session.posargs or [*SOAK_TESTS, "-m", "not slow"]
    session.run("pytest", *tests, env={"BOUNDEDDB_SOAK": os.environ.get("BOUNDEDDB_SOAK", "30")})


#: The chaos soak's slice in .ci/run: seeded, short jobs, about 90 s of faults (about 3 minutes in all).
CHAOS_CI = ["--duration", "90", "--seed", "54", "--scale", "0.05"]


@nox.session
def chaos(session: nox.Session) -> None:
    """
    Run the chaos soak (tests/chaos): every runner and driver through a fault proxy to a PostgreSQL of
    its own (and the local MariaDB, if it answers), with a fault every 1-2 s and a crash every 90 s,
    then check every operation's outcome against the database. `-- --duration 3600 --seed N` (see
    `-- --help`); the default is 600 s from a new seed. It exits 1 if it found an anomaly. Not among
    the default sessions: .ci/run runs its seeded slice, CHAOS_CI.
    """
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.chaos", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmark suite (the project's main job); pass options after `--`."""
    session.install("-e", ".[bench]")
    _install_mysqlclient(session)
    if not os.path.exists("benchmarks/__main__.py"):
        session.log("The benchmark suite lands with the benchmarks issue; nothing to run yet.")
        return
    session.run("python", "-m", "benchmarks", *session.posargs)
