"""
Every Python example in README.md and docs/ runs, as written, against the real PostgreSQL.

Each page's ```` ```python ```` blocks are joined in order into one script (a reader who copies
them one after another gets the same program), which runs in a fresh interpreter in a temporary
directory. The examples' URLs (``postgresql+asyncpg://postgres@127.0.0.1/test`` and the like) are
replaced with the test server's, so a machine with only an embedded PostgreSQL runs them too.

Two spellings tell this test more than "run me":

- A block whose first line is ``# docs: not-run (reason)`` is shown but not run. Keep these few:
  a runnable, shrunken example is better than one that is only read.
- A ```` ```{code-block} python ```` directive with ``:caption: NAME.py`` is a file of that name:
  it is written into the page's directory instead of joining the script (the script may import
  it), and if any such file is named ``test_*.py`` pytest runs that directory after the script.

Pages that import an optional package (FastAPI, Starlette, httpx, uvicorn) are skipped, saying
which, where it is not installed.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from boundeddb.testing import PostgresServer
from tests.support.pages import DOCS, ROOT, Block, python_blocks, with_test_server

pytestmark = [pytest.mark.postgres]

#: The longest line of an example that fits the page without scrolling (furo, a 1280-pixel window).
MAX_LINE = 88
#: How long one page's examples may take, in seconds (the slowest pages take about 30 s on 2 cores).
PAGE_TIMEOUT_S = 240
#: Packages some pages need that the test extra may not install: such a page is skipped without them.
OPTIONAL_MODULES = frozenset({"fastapi", "starlette", "httpx", "uvicorn"})
#: What an imported module needs besides its own package (the frameworks' test clients run on httpx).
ALSO_NEEDS = {"fastapi.testclient": "httpx", "starlette.testclient": "httpx"}


def pages() -> list[Path]:
    """README.md and every docs page that has a Python example."""
    candidates = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
    return [path for path in candidates if python_blocks(path)]


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def imported_modules(code: str) -> set[str]:
    """The modules that ``code`` imports, by their full dotted names."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def missing_optional_packages(blocks: list[Block]) -> list[str]:
    """The optional packages that ``blocks`` need and that are not installed."""
    imported = set().union(*(imported_modules(block.code) for block in blocks))
    needed = {module.split(".")[0] for module in imported}
    needed |= {ALSO_NEEDS[module] for module in imported if module in ALSO_NEEDS}
    return sorted(name for name in needed & OPTIONAL_MODULES if importlib.util.find_spec(name) is None)


def too_new_for_this_python(code: str) -> bool:
    """Whether ``code`` uses syntax this interpreter lacks (``except*`` before Python 3.11)."""
    return sys.version_info < (3, 11) and "except*" in code


def run(command: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    """Run ``command``; fail with its output if it fails or outlasts the page timeout."""
    try:
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as expired:
        output = f"--- stdout\n{expired.stdout}\n--- stderr\n{expired.stderr}"
        pytest.fail(f"{what} took more than {PAGE_TIMEOUT_S} s\n{output}")
    if done.returncode != 0:
        pytest.fail(f"{what} exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_the_pages_examples_run(page: Path, pg_server: PostgresServer, tmp_path: Path) -> None:
    """A page's Python blocks, joined in order (and its files, and their tests), run without error."""
    blocks = [block for block in python_blocks(page) if block.not_run_reason is None]
    if any(too_new_for_this_python(block.code) for block in blocks):
        pytest.skip(f"{page_id(page)} uses except*, which needs Python 3.11")
    missing = missing_optional_packages(blocks)
    if missing:
        pytest.skip(f"{page_id(page)} needs {', '.join(missing)} (pip install {' '.join(missing)})")
    script: list[str] = []
    test_files = False
    for block in blocks:
        code = with_test_server(block.code, pg_server)
        if block.file_name is not None:
            (tmp_path / block.file_name).write_text(code, encoding="utf-8")
            test_files = test_files or block.file_name.startswith("test_")
        else:
            script.append(f"# --- {page_id(page)}, line {block.line}\n{code}")
    env = {
        **os.environ,
        # boundeddb.testing.postgres() in the examples finds the same server (never a second embedded one).
        "BOUNDEDDB_TEST_DATABASE_URL": pg_server.url.render_as_string(hide_password=False),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if script:
        (tmp_path / "example.py").write_text("\n\n".join(script), encoding="utf-8")
        run([sys.executable, "example.py"], tmp_path, env, f"the examples of {page_id(page)}")
    if test_files:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
        run([*command, str(tmp_path)], tmp_path, env, f"pytest on the test files of {page_id(page)}")


def test_every_not_run_block_says_why() -> None:
    """A Python block is either run or marked ``# docs: not-run (reason)`` with a reason; few are not run."""
    not_run = []
    for page in pages():
        for block in python_blocks(page):
            first = block.code.lstrip("\n").split("\n", 1)[0]
            if first.startswith("# docs:"):
                assert block.not_run_reason, f"{page_id(page)}:{block.line}: write `# docs: not-run (reason)`"
                not_run.append(f"{page_id(page)}:{block.line}")
    assert len(not_run) <= 5, f"too many examples are not run: {not_run}"


def test_every_example_is_valid_python() -> None:
    """Even the blocks that are not run parse, so that a reader can paste them."""
    for page in pages():
        for block in python_blocks(page):
            if too_new_for_this_python(block.code):
                continue
            try:
                ast.parse(block.code)
            except SyntaxError as error:
                pytest.fail(f"{page_id(page)}:{block.line + (error.lineno or 0)}: {error.msg}")


def test_every_example_fits_the_page() -> None:
    """No line of a Python example is longer than MAX_LINE, so readers never scroll sideways."""
    long_lines = [
        f"{page_id(page)}:{block.line + offset + len(block.options) + 1} ({len(line)} characters)"
        for page in pages()
        for block in python_blocks(page)
        for offset, line in enumerate(block.code.splitlines())
        if len(line) > MAX_LINE
    ]
    assert long_lines == [], f"example lines longer than {MAX_LINE} characters: {long_lines}"


def test_every_public_name_is_in_the_reference() -> None:
    """Every name in boundeddb.__all__ and boundeddb.testing.__all__ is documented on a reference page."""
    import boundeddb
    import boundeddb.testing

    reference = "\n".join(path.read_text(encoding="utf-8") for path in (DOCS / "reference").glob("*.md"))
    missing = [f"boundeddb.{name}" for name in boundeddb.__all__ if f"boundeddb.{name}" not in reference]
    missing += [
        f"boundeddb.testing.{name}"
        for name in boundeddb.testing.__all__
        if not re.search(rf"\b{name}\b", reference.partition("boundeddb.testing")[2])
    ]
    assert missing == [], f"public names missing from docs/reference/: {missing}"


def test_the_guarantees_cite_tests_that_exist() -> None:
    """Every ``file::[Class::]function`` the guarantees page names is a test in tests/."""
    page = (DOCS / "explanation" / "guarantees.md").read_text(encoding="utf-8")
    cited = set(re.findall(r"`(\w+/test_\w+\.py)::(?:(Test\w+)::)?(test_\w+)`", page))
    assert cited, "the guarantees page names no tests"
    missing = []
    for file, cls, function in sorted(cited):
        source = (ROOT / "tests" / file).read_text(encoding="utf-8")
        in_class = not cls or re.search(rf"^class {cls}\b", source, re.M)
        if not (in_class and re.search(rf"^\s*(async )?def {function}\(", source, re.M)):
            missing.append(f"{file}::{cls + '::' if cls else ''}{function}")
    assert missing == [], f"docs/explanation/guarantees.md names tests that do not exist: {missing}"


def test_the_readme_quickstart_is_the_tutorials_first_example() -> None:
    """README's Quickstart and the tutorial's first example are the same code, character for character."""
    readme = python_blocks(ROOT / "README.md")[0].code
    tutorial = python_blocks(DOCS / "tutorial.md")[0].code
    assert readme == tutorial, "README.md's Quickstart and docs/tutorial.md's first example differ"
