"""
What the web scenarios (``loop-lag``, ``post-004``) share: serving, ``/ping``, load, GC pauses.

An ASGI app is served by uvicorn in this process on a loopback port; the load comes from
:mod:`benchmarks.workers.loadgen` processes; :class:`GcPauses` times this process's collections.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from .. import workers

#: How long a load generator may take to connect and say ``ready``.
READY_TIMEOUT_S = 60


async def ping(request: Request) -> PlainTextResponse:
    """``/ping``: no database, nothing to wait for but the event loop."""
    return PlainTextResponse("pong")


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in this process on a free loopback port; its base URL."""
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
    # Without it each response's body waits ~40 ms behind its headers for the client's delayed
    # ACK (Nagle), which `uvicorn --host --port` (getaddrinfo, proto 6) does not suffer.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


async def spawn(*args: str) -> asyncio.subprocess.Process:
    """A :mod:`benchmarks.workers.loadgen` process with ``args``, its stdin and stdout piped."""
    return await asyncio.create_subprocess_exec(
        *workers.command("loadgen", *args),
        cwd=workers.ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def ready(proc: asyncio.subprocess.Process) -> None:
    """Wait until the load generator has connected and says ``ready``."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
    if line.strip() != b"ready":
        raise RuntimeError(f"load generator did not start: {line!r}")


async def go(proc: asyncio.subprocess.Process) -> None:
    """Tell a ready load generator to start."""
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()


async def result(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """The JSON object a load generator prints when it is done."""
    assert proc.stdout is not None
    out = await proc.stdout.read()
    if await proc.wait():
        raise RuntimeError(f"load generator exited with {proc.returncode}")
    found: dict[str, Any] = json.loads(out)
    return found


async def stop(*procs: asyncio.subprocess.Process) -> None:
    """Kill the load generators that are still running."""
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


class GcPauses:
    """Times every garbage collection in this process while open (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, Any]:
        full = [s for generation, s in self.pauses if generation == 2]
        return {
            "gc_collections": len(self.pauses),
            "gc_full_collections": len(full),
            "gc_max_pause_s": max((s for _, s in self.pauses), default=None),
            "gc_full_max_pause_s": max(full, default=None),
            "gc_total_s": sum(s for _, s in self.pauses),
        }
