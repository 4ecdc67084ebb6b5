"""
The web how-to's FastAPI app (``shop.py`` in docs/how-to/web-apps.md) served by a real uvicorn on a
real port, with uvloop and httptools as post 002 ran it, under concurrent clients.

The test serves the page's own code (its URL replaced with the test server's) plus one endpoint of
its own, ``/slow``, whose unit holds its connection in ``pg_sleep``: while 50 of those are in
flight at the runner's limit of 10, the server never has more than 10 of the app's connections,
``/ping`` answers every time and faster than one slow unit takes (an endpoint that blocked the
loop would hold it for a whole unit), and on shutdown the lifespan disposes the engine, so none
of the app's connections is left.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from boundeddb.testing import PostgresServer
from tests.support.kits import eventually
from tests.support.pages import ROOT, python_blocks, with_test_server
from tests.support.ports import free_port
from tests.support.probes import ActivitySampler, backends, terminate_backends

pytest.importorskip("uvloop", reason="uvloop is part of the test extra")
pytest.importorskip("httptools", reason="httptools is part of the test extra")

pytestmark = [pytest.mark.postgres]

SLOW_S = 1.0
SLOW_REQUESTS = 50
LIMIT = 10

SLOW_ENDPOINT = f"""

from sqlalchemy import text as _text


@app.get("/slow")
async def slow(runner: Runner) -> dict[str, int]:
    def unit(session: Session) -> int:
        session.execute(_text("SELECT pg_sleep({SLOW_S})"))
        return 1

    return {{"done": await runner.submit(unit)}}
"""


def shop_source(server: PostgresServer) -> str:
    page = ROOT / "docs" / "how-to" / "web-apps.md"
    (block,) = [b for b in python_blocks(page) if b.file_name == "shop.py"]
    return with_test_server(block.code, server) + SLOW_ENDPOINT


async def load(base: str) -> tuple[list[int], list[float], list[dict[str, int]]]:
    """50 slow requests at once, /ping and /runner every 20 ms meanwhile: statuses, ping times, states."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        slow = [asyncio.create_task(client.get("/slow")) for _ in range(SLOW_REQUESTS)]
        pings: list[float] = []
        states: list[dict[str, int]] = []
        while not all(task.done() for task in slow):
            started = time.perf_counter()
            response = await client.get("/ping")
            pings.append(time.perf_counter() - started)
            assert response.json() == "pong"
            states.append((await client.get("/runner")).json())
            await asyncio.sleep(0.02)
        statuses = [(await task).status_code for task in slow]
        order = await client.post("/orders", params={"item": "tea", "quantity": 2})
        assert order.status_code == 200, order.text
        assert (await client.get(f"/orders/{order.json()['id']}")).json()["item"] == "tea"
    return statuses, pings, states


@pytest.mark.serial  # /ping's latencies are measured: an idle machine's (the serial group)
def test_the_web_how_to_app_under_uvicorn_with_uvloop_and_httptools(
    tmp_path: Path, pg_server: PostgresServer, admin: Engine, app_name: str
) -> None:
    (tmp_path / "shop.py").write_text(shop_source(pg_server))
    with admin.connect() as c:  # the page's app expects its table (a real app has migrations)
        c.execute(
            text(
                "CREATE TABLE IF NOT EXISTS public.howto_web_orders (id serial PRIMARY KEY, "
                "item varchar(100) NOT NULL, quantity int NOT NULL)"
            )
        )
    port = free_port()
    env = {**os.environ, "PGAPPNAME": app_name}  # libpq: the app's connections carry the test's name
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "shop:app", "--host", "127.0.0.1", "--port", str(port),
         "--loop", "uvloop", "--http", "httptools", "--no-access-log"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert eventually(lambda: _answers(port), 30), "uvicorn did not start"
        with ActivitySampler(admin, app_name) as sampler:
            statuses, pings, states = asyncio.run(load(f"http://127.0.0.1:{port}"))
        assert statuses == [200] * SLOW_REQUESTS
        assert len(pings) >= 5, "the slow requests finished before /ping was asked"
        # The loop was never held: a sync unit on it would block /ping for a whole unit, nearly every
        # time. The median and p90 say so; the slowest ping measures the machine when other
        # processes want its cores (the server's and this client's loops wait for one then).
        ranked = sorted(pings)
        p50, p90 = ranked[len(ranked) // 2], ranked[int(0.9 * (len(ranked) - 1))]
        assert p50 < SLOW_S / 4, f"/ping took {p50:.3f} s (median) while units of {SLOW_S} s ran"
        assert p90 < SLOW_S, f"/ping took {p90:.3f} s (p90) while units of {SLOW_S} s ran: {ranked[-5:]}"
        assert max(s["in_flight"] for s in states) == LIMIT  # the burst filled the runner ...
        assert all(s["in_flight"] <= s["limit"] == LIMIT for s in states)  # ... and never more
        assert 1 <= sampler.peak <= LIMIT, f"{sampler.peak} connections for a runner of {LIMIT}"
        server.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown runs the lifespan's exit
        output, _ = server.communicate(timeout=30)
        assert server.returncode == 0, output[-3000:]
        assert "Application shutdown complete" in output
        # engine.dispose() in the lifespan: none of the app's connections is left.
        assert eventually(lambda: backends(admin, app_name) == 0, 10)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
        terminate_backends(admin, app_name)
        with admin.connect() as c:
            c.execute(text("DROP TABLE IF EXISTS public.howto_web_orders"))


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ping", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
