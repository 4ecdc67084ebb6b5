"""ProcessRunner on Dask: who may connect to its callback port, what crosses it, where the password goes."""

from __future__ import annotations

import contextlib
import logging
import pickle
import secrets
import socket
import threading
import traceback
from collections.abc import Iterator
from functools import partial
from multiprocessing import AuthenticationError
from multiprocessing.connection import answer_challenge
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession

from boundeddb import ProcessRunner, RunFailed
from boundeddb._processes import callback
from boundeddb.testing import PostgresServer, driver_url
from tests.support.telemetry import Telemetry, telemetry_fixture  # noqa: F401 -- a fixture pytest finds here

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]

#: Something that travels in every item and every value, to look for on the wire.
MARKER = "marker-" + secrets.token_hex(8)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def echo(session: AsyncSession, item: str) -> str:
    """A unit that reads and returns its item."""
    await session.execute(text("SELECT 1"))
    return item


async def divide_by_zero(session: AsyncSession, item: int) -> int:
    """A unit that fails on the server, its statement in the error."""
    await session.execute(text("SELECT 1 / 0"))
    return item


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, Any]]:
    """
    Clients of two LocalClusters whose workers run in this process, so that their logs reach caplog:
    ``"plain"`` over TCP, and ``"tls"`` with a self-signed certificate made for it.
    """
    from distributed import Client, LocalCluster
    from distributed.security import Security

    def cluster(**options: Any) -> LocalCluster:
        return LocalCluster(
            n_workers=2, threads_per_worker=2, processes=False, dashboard_address="127.0.0.1:0", **options
        )

    with (
        cluster(protocol="tcp://") as plain,
        Client(plain) as plain_client,
        cluster(security=Security.temporary()) as tls,
        Client(tls) as tls_client,
    ):
        yield {"plain": plain_client, "tls": tls_client}


@pytest.fixture
def plain_client(clusters: dict[str, Any]) -> Any:
    return clusters["plain"]


@pytest.fixture
def url(pg_server: PostgresServer) -> URL:
    return driver_url(pg_server.url, "asyncpg")


def callback_address(runner: ProcessRunner) -> tuple[str, int]:
    address: tuple[str, int] = runner._fleet.backend._address  # type: ignore[attr-defined]
    return address


def until_closed(sock: socket.socket) -> None:
    """Read ``sock`` until the runner closes it: it logs a refused peer before that."""
    sock.settimeout(60)
    while sock.recv(4096):
        pass


# -- peers that are not the runner's tasks ----------------------------------------------------------------


async def test_silent_peers_hold_up_no_map(
    plain_client: Any, url: URL, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Peers on the callback port that say nothing, before the tasks start and during a map, delay neither."""
    deadline = 60.0
    monkeypatch.setattr(callback, "HANDSHAKE_TIMEOUT_S", deadline)
    caplog.set_level(logging.WARNING, logger="boundeddb.processes")
    silent: list[socket.socket] = []
    runner = ProcessRunner(url, limit=2, cluster=plain_client)
    address = callback_address(runner)
    assert address[0] == "127.0.0.1"  # the interface toward the scheduler, not every interface
    silent += [socket.create_connection(address) for _ in range(3)]  # before any task connects back

    def items() -> Iterator[str]:
        for n in range(40):
            if n == 10:
                silent.extend(socket.create_connection(address) for _ in range(3))
            yield f"{MARKER}-{n}"

    try:
        # Their handshakes wait for the deadline: the workers and the map may not.
        with anyio.fail_after(deadline):
            async with runner:
                report = await runner.map(echo, items())
        assert report.values() == [f"{MARKER}-{n}" for n in range(40)]
        assert len(silent) == 6
        assert [
            r.getMessage() for r in caplog.records if r.name.startswith("boundeddb")
        ] == []  # still waiting
    finally:
        for sock in silent:
            sock.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_bad_peers_are_refused_and_logged_once(
    tls: bool,
    clusters: dict[str, Any],
    url: URL,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Garbage, a wrong key and silence: each refused, one WARNING with its address, and the map goes on."""
    monkeypatch.setattr(callback, "HANDSHAKE_TIMEOUT_S", 3.0)
    caplog.set_level(logging.WARNING, logger="boundeddb.processes")
    client = clusters["tls" if tls else "plain"]
    async with ProcessRunner(url, limit=2, cluster=client) as runner:
        address = callback_address(runner)
        garbage = socket.create_connection(address)
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: boundeddb\r\n\r\n")
        silent = socket.create_connection(address)
        wrong = socket.create_connection(address)
        peers = {"garbage": garbage, "silent": silent, "wrong": wrong}
        ports: dict[str, int] = {name: sock.getsockname()[1] for name, sock in peers.items()}
        wrong_key = callback.Channel(wrong, None)  # with the cluster's certificate, when in TLS
        try:
            report = await runner.map(echo, [f"{MARKER}-{n}" for n in range(20)])
            if tls:
                context = client.security.get_connection_args("client")["ssl_context"]
                await anyio.to_thread.run_sync(partial(wrong_key.start_tls, context, server_side=False))
            with pytest.raises(AuthenticationError):
                await anyio.to_thread.run_sync(answer_challenge, wrong_key, secrets.token_bytes(32))
            with pytest.raises(EOFError):
                await anyio.to_thread.run_sync(wrong_key.recv_bytes)  # refused, so logged
            for sock in (garbage, silent):
                await anyio.to_thread.run_sync(until_closed, sock)
            after = await runner.map(echo, ["after"])
        finally:
            garbage.close()
            silent.close()
            wrong_key.close()
    assert report.values() == [f"{MARKER}-{n}" for n in range(20)]
    assert after.values() == ["after"]
    ours = [record for record in caplog.records if record.name.startswith("boundeddb")]
    assert all(record.levelno == logging.WARNING for record in ours)
    where = f"refused a connection to the callback port 127.0.0.1:{address[1]} from 127.0.0.1:"
    refused = [record.getMessage().removeprefix(where).split(": ", 1) for record in ours]
    assert sorted(int(port) for port, _ in refused) == sorted(ports.values())  # each peer once
    reasons = {int(port): reason for port, reason in refused}
    if tls:
        assert reasons[ports["garbage"]].startswith("its TLS handshake failed (")
    else:
        assert reasons[ports["garbage"]] == "its handshake is malformed (OSError: bad message length)"
    assert reasons[ports["silent"]] == "no complete handshake within 3.0 s"
    assert reasons[ports["wrong"]] == "it does not know the runner's key"


# -- what crosses the network -------------------------------------------------------------------------------


class Relay:
    """A TCP relay to ``target`` that keeps every byte each way: what a tap on the wire sees."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        #: Per connection: what the task sent, and what the runner sent.
        self.seen: list[tuple[bytearray, bytearray]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                task, _ = self._server.accept()
            except OSError:
                return
            runner = socket.create_connection(self._target)
            sent, answered = bytearray(), bytearray()
            self.seen.append((sent, answered))
            threading.Thread(target=self._pump, args=(task, runner, sent), daemon=True).start()
            threading.Thread(target=self._pump, args=(runner, task, answered), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, seen: bytearray) -> None:
        try:
            while data := source.recv(65536):
                seen += data
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):  # one side ended: end both, as a real hop would
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        source.close()

    def close(self) -> None:
        self._server.close()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
async def test_the_callback_is_tls_when_the_cluster_is(
    tls: bool, clusters: dict[str, Any], pg_server: PostgresServer
) -> None:
    """With Security.temporary(): TLS from the first byte both ways, no item, value or password to read."""
    password = "pw-" + secrets.token_hex(8)
    url = driver_url(pg_server.url, "asyncpg").set(password=password)  # the server trusts 127.0.0.1
    runner = ProcessRunner(url, limit=2, cluster=clusters["tls" if tls else "plain"])
    relay = Relay(callback_address(runner))
    runner._fleet.backend._address = relay.address  # type: ignore[attr-defined]  # the tasks go through it
    try:
        async with runner:
            report = await runner.map(echo, [f"{MARKER}-{n}" for n in range(20)])
    finally:
        relay.close()
    assert report.values() == [f"{MARKER}-{n}" for n in range(20)]
    assert len(relay.seen) == 2
    for sent, answered in relay.seen:
        wire = bytes(sent + answered)
        if tls:
            assert sent[:2] == b"\x16\x03"  # a TLS handshake record: the ClientHello
            assert answered[:2] == b"\x16\x03"  # the ServerHello
            assert b"#CHALLENGE#" not in wire
            assert MARKER.encode() not in wire
            assert password.encode() not in wire
        else:  # what the docs say travels in the clear
            assert answered[4:15] == b"#CHALLENGE#"
            assert MARKER.encode() in wire
            assert password.encode() in wire


# -- the password -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["processes", "dask", "dask-tls"])
async def test_the_password_is_nowhere_in_a_failed_run(
    where: str,
    clusters: dict[str, Any],
    pg_server: PostgresServer,
    telemetry: Telemetry,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Not in a log record at DEBUG, the exception and its traceback, a repr, a span, a metric, the tasks."""
    caplog.set_level(logging.DEBUG)
    cluster = {"processes": None, "dask": clusters["plain"], "dask-tls": clusters["tls"]}[where]
    password = "pw-" + secrets.token_hex(8)
    url = driver_url(pg_server.url, "asyncpg").set(password=password)  # the server trusts 127.0.0.1
    seen: list[str] = []
    async with ProcessRunner(url, limit=2, processes=2, cluster=cluster) as runner:
        with pytest.raises(RunFailed) as failed:
            await runner.map(divide_by_zero, range(10))
        seen += [repr(runner), repr(runner.statistics()), str(failed.value)]
        seen.append("".join(traceback.format_exception(failed.value)))
        seen += [repr(error) for error in failed.value.exceptions]
        if cluster is not None:  # the tasks' arguments, as the scheduler keeps them
            tasks = cluster.cluster.scheduler.tasks
            specs = [state.run_spec for key, state in tasks.items() if str(key).startswith("boundeddb-")]
            assert len(specs) == 2
            seen += [repr(spec) for spec in specs]
            seen += [pickle.dumps(spec).decode("latin-1") for spec in specs]
    assert "division by zero" in seen[3]  # the failure is there, with its statement
    seen += [record.getMessage() for record in caplog.records]
    seen += [logging.Formatter().format(record) for record in caplog.records]
    seen += [span.to_json() for span in telemetry.exporter.get_finished_spans()]
    metrics = telemetry.reader.get_metrics_data()
    seen.append("" if metrics is None else metrics.to_json())
    output = capfd.readouterr()  # the worker processes' own stdout and stderr
    seen += [output.out, output.err]
    assert [text for text in seen if password in text] == []
