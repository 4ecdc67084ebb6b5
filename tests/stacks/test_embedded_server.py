"""boundeddb.testing.postgres() on a machine where no PostgreSQL answers: the embedded server."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("pgserver") is None,
        reason="pgserver is not installed (it has no wheel for Python 3.13 and later)",
    ),
]


def test_the_embedded_fallback_starts_cleanly_with_warnings_as_errors() -> None:
    """With nothing at the default URL, no XDG_RUNTIME_DIR and -W error, an embedded server answers."""
    script = textwrap.dedent(
        """
        from sqlalchemy import create_engine, text
        from boundeddb.testing import driver_url, postgres

        # Port 1: nothing listens there, so postgres() must start the embedded server.
        with postgres("postgresql://postgres@127.0.0.1:1/test", env_var="BOUNDEDDB_NO_SUCH_VAR") as server:
            engine = create_engine(driver_url(server.url, "psycopg"))
            with engine.connect() as connection:
                print(server.source, connection.execute(text("SELECT 1")).scalar_one())
            engine.dispose()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["embedded", "1"]
