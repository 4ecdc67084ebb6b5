"""
The chaos soak's network: a TCP proxy that injects faults, and understands enough of the PostgreSQL
and MySQL wire protocols to find a ``COMMIT`` on its way to the server.

One :class:`ProxyLoop`, an asyncio loop in a thread of its own, carries any number of
:class:`FaultProxy` listeners. Their methods are called from other threads (the nemesis, a test) and
return once the fault is in place:

- :meth:`FaultProxy.arm_commit`: the next ``COMMIT`` of any connection is *dropped* (never forwarded;
  the client is cut off) or has its *reply dropped* (forwarded, so the server commits, but the
  client is cut off before it hears back);
- :meth:`FaultProxy.reset`: connections reset (RST) on both sides;
- :meth:`FaultProxy.freeze`: connections frozen half-open (nothing flows, neither side is told)
  for a while, then reset;
- :meth:`FaultProxy.latency`: an episode in which each connection gets its own delay, both ways, so
  that a message on a new connection (a cancel request) can overtake one on an old connection;
- :meth:`FaultProxy.hold_next_statement`: the next message of each open connection waits, so that
  one on a new connection (a cancel request) overtakes it;
- :meth:`FaultProxy.hold_new` / :meth:`FaultProxy.refuse_new`: new connections wait unanswered, or
  are closed at once, as when the server is unreachable or down.

Client messages are split by the protocol's framing: PostgreSQL's untyped startup packets, then typed
messages (a simple query ``Q`` whose text is ``COMMIT`` is a COMMIT; asyncpg, psycopg and psycopg2
commit so); MySQL's packets (a ``COM_QUERY`` of ``COMMIT``: pymysql, aiomysql, asyncmy). Nothing is
decrypted: the soak's clients connect without TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["CommitTrap", "FaultProxy", "ProxyLoop"]

T = TypeVar("T")

Protocol = Literal["postgresql", "mysql"]
CommitMode = Literal["drop", "drop-reply"]

#: PostgreSQL's startup-phase codes that another untyped packet follows (TLS and GSS negotiation).
_SSL_REQUEST, _GSSENC_REQUEST = 80877103, 80877104
#: MySQL's COM_QUERY command byte.
_COM_QUERY = 0x03
#: How long the server side of a cut connection may take to answer the COMMIT before it is closed.
_ANSWER_WAIT_S = 10.0
_CHUNK = 65536


class ProxyLoop:
    """The proxies' asyncio loop, in a daemon thread: ``call()`` runs a coroutine on it from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        #: What the loop's exception handler was given: the soak reports any of it as a fault of its own.
        self.errors: list[str] = []
        self.loop.set_exception_handler(self._on_error)
        self._thread = threading.Thread(target=self._run, name="chaos-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _on_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.errors.append(str(context.get("exception") or context.get("message")))

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coroutine`` on the loop and return its result (or raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop once every proxy on it is closed."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


@dataclasses.dataclass(eq=False)
class CommitTrap:
    """Armed COMMIT faults: how many are left, and how many took effect (``fired`` is set at the first)."""

    mode: CommitMode
    left: int
    taken: int = 0
    fired: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: Called on the proxy's loop as each trap takes effect (the nemesis chains a crash onto a drop).
    then: Callable[[], None] | None = None


class _Link:
    """One client connection through the proxy, and its own connection to the server."""

    def __init__(self, number: int, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.number = number
        self.client = client
        self.server = server
        #: Set while data flows; cleared while the link is frozen.
        self.flowing = asyncio.Event()
        self.flowing.set()
        #: Seconds each chunk waits before it is passed on, in either direction.
        self.delay = 0.0
        #: Seconds the next chunk from the client waits before it is passed on (then 0).
        self.hold_next = 0.0
        #: Set once a COMMIT was cut: nothing from the server reaches the client after it.
        self.cut = False
        self.closed = False
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self, *, client: bool = True, server: bool = True) -> None:
        """Reset the chosen sides: RST, not FIN (``SO_LINGER`` 0), as a broken network would."""
        for wanted, writer in ((client, self.client), (server, self.server)):
            if wanted:
                _abort(writer)
        if client and server:
            self.closed = True


class FaultProxy:
    """A listener on 127.0.0.1 that forwards to ``upstream`` and injects faults. See the module docstring."""

    def __init__(
        self, loop: ProxyLoop, upstream: tuple[str, int] | str, protocol: Protocol, *, name: str = ""
    ) -> None:
        self.name = name or protocol
        self.protocol = protocol
        self._loop = loop
        self._upstream = upstream
        self._links: dict[int, _Link] = {}
        self._numbers = iter(range(1, 1 << 62))
        self._traps: list[CommitTrap] = []
        self._hold: asyncio.Event | None = None
        self._refusing = False
        #: What :meth:`freeze_at` waits for, and how many links it has yet to freeze.
        self._freeze_needle = b""
        self._freezes_left = 0
        #: Links frozen by :meth:`freeze_at`.
        self.frozen_at = 0
        self._latency_until = 0.0
        self._latency_max = 0.0
        self._latency_rng = random.Random(0)
        #: Connections accepted, and those closed at once because the server could not be reached.
        self.accepted = 0
        self.unreachable = 0
        self._server: asyncio.base_events.Server = loop.call(self._listen())
        self.port: int = self._server.sockets[0].getsockname()[1]

    async def _listen(self) -> asyncio.base_events.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0, limit=_CHUNK)

    # -- faults, from any thread ------------------------------------------------------------------------

    def links(self) -> int:
        """How many client connections are open through the proxy now."""
        return self._loop.call(self._count())

    async def _count(self) -> int:
        return sum(not link.closed for link in self._links.values())

    def arm_commit(
        self, mode: CommitMode, count: int = 1, then: Callable[[], None] | None = None
    ) -> CommitTrap:
        """Cut the next ``count`` COMMITs the clients send, as ``mode`` says (the module docstring)."""
        trap = CommitTrap(mode, count, then=then)
        self._loop.call(self._arm(trap))
        return trap

    async def _arm(self, trap: CommitTrap) -> None:
        self._traps.append(trap)

    def disarm(self) -> int:
        """Take back every COMMIT fault that has not taken effect yet; how many were left."""
        return self._loop.call(self._disarm())

    async def _disarm(self) -> int:
        left = sum(trap.left for trap in self._traps)
        self._traps.clear()
        return left

    def reset(self, count: int | None = None, rng: random.Random | None = None) -> int:
        """Reset ``count`` connections chosen at random (all of them if None); how many were reset."""
        return self._loop.call(self._reset(count, rng or random.Random()))

    async def _reset(self, count: int | None, rng: random.Random) -> int:
        chosen = self._choose(count, rng)
        for link in chosen:
            link.abort()
        return len(chosen)

    def freeze(self, count: int | None, seconds: float, rng: random.Random | None = None) -> int:
        """Freeze ``count`` connections (all if None) for ``seconds``, then reset them; how many froze."""
        return self._loop.call(self._freeze(count, seconds, rng or random.Random()))

    async def _freeze(self, count: int | None, seconds: float, rng: random.Random) -> int:
        chosen = self._choose(count, rng)
        for link in chosen:
            link.flowing.clear()
        self._loop.loop.call_later(seconds, self._thaw_by_reset, chosen)
        return len(chosen)

    def _thaw_by_reset(self, links: list[_Link]) -> None:
        for link in links:
            link.abort()
            link.flowing.set()  # let the pumps see the closed sockets and end

    def latency(self, most: float, seconds: float, rng: random.Random | None = None) -> None:
        """For ``seconds``, each connection's chunks wait its own delay, drawn up to ``most`` seconds."""
        self._loop.call(self._latency(most, seconds, rng or random.Random()))

    async def _latency(self, most: float, seconds: float, rng: random.Random) -> None:
        self._latency_rng = rng
        self._latency_max = most
        self._latency_until = self._loop.loop.time() + seconds
        for link in self._links.values():
            link.delay = rng.uniform(0, most)
        self._loop.loop.call_later(seconds, self._end_latency)

    def _end_latency(self) -> None:
        if self._loop.loop.time() >= self._latency_until:
            for link in self._links.values():
                link.delay = 0.0

    def freeze_at(self, needle: bytes, count: int = 1) -> None:
        """
        The next ``count`` links to send a chunk holding ``needle`` freeze there: the chunk never
        reaches the server, nothing flows either way, until the proxy closes.
        """
        self._loop.call(self._set_freeze(needle, count))

    async def _set_freeze(self, needle: bytes, count: int) -> None:
        self._freeze_needle, self._freezes_left = needle, count

    def hold_next_statement(self, seconds: float) -> None:
        """
        The next message each open connection sends to the server waits ``seconds`` first; new
        connections' messages do not: a cancel request for that statement overtakes it.
        """
        self._loop.call(self._hold_next(seconds))

    async def _hold_next(self, seconds: float) -> None:
        for link in self._links.values():
            link.hold_next = seconds

    def hold_new(self) -> None:
        """New connections are accepted but wait, unanswered, until :meth:`release_new`."""
        self._loop.call(self._set_hold(True))

    def release_new(self) -> None:
        """The connections held by :meth:`hold_new` go on to the server."""
        self._loop.call(self._set_hold(False))

    async def _set_hold(self, on: bool) -> None:
        if on and self._hold is None:
            self._hold = asyncio.Event()
        elif not on and self._hold is not None:
            self._hold.set()
            self._hold = None

    def refuse_new(self, on: bool) -> None:
        """While on, each new connection is closed as soon as it is accepted."""
        self._refusing = on

    def close(self) -> None:
        """Stop listening and reset every connection."""
        with contextlib.suppress(RuntimeError, TimeoutError, asyncio.CancelledError):
            self._loop.call(self._close())

    async def _close(self) -> None:
        self._server.close()
        if self._hold is not None:
            self._hold.set()
        for link in list(self._links.values()):
            link.abort()
            link.flowing.set()
        tasks = [task for link in self._links.values() for task in link.tasks]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _choose(self, count: int | None, rng: random.Random) -> list[_Link]:
        open_links = [link for link in self._links.values() if not link.closed]
        if count is None or count >= len(open_links):
            return open_links
        return rng.sample(open_links, count)

    # -- the proxy's tasks ------------------------------------------------------------------------------

    async def _accept(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refusing:
            _abort(client_out)
            return
        if self._hold is not None:
            await self._hold.wait()
            if _client_left(client_in, client_out):
                _close(client_out)  # it gave up while held: the server never hears of it
                return
        try:
            if isinstance(self._upstream, str):
                server_in, server_out = await asyncio.open_unix_connection(self._upstream, limit=_CHUNK)
            else:
                server_in, server_out = await asyncio.open_connection(*self._upstream, limit=_CHUNK)
        except OSError:
            self.unreachable += 1
            _abort(client_out)
            return
        link = _Link(next(self._numbers), client_out, server_out)
        if self._loop.loop.time() < self._latency_until:
            link.delay = self._latency_rng.uniform(0, self._latency_max)
        self._links[link.number] = link
        to_server = asyncio.ensure_future(self._to_server(link, client_in))
        to_client = asyncio.ensure_future(self._to_client(link, server_in))
        link.tasks = [to_server, to_client]
        try:
            await asyncio.gather(to_server, to_client, return_exceptions=True)
        finally:
            link.closed = True
            _close(link.client)
            _close(link.server)
            del self._links[link.number]

    async def _to_client(self, link: _Link, server_in: asyncio.StreamReader) -> None:
        """Server to client, until either side is gone; after a cut COMMIT, the server's answer is dropped."""
        broken = False
        try:
            while data := await server_in.read(_CHUNK):
                if link.cut:
                    break  # the COMMIT's answer: the client never hears it
                await link.flowing.wait()
                if link.closed:
                    break
                if link.delay:
                    await asyncio.sleep(link.delay)
                link.client.write(data)
                await link.client.drain()
        except OSError:
            broken = True
        finally:
            if link.cut:
                _close(link.server)
            elif broken:
                link.abort()  # a reset passes on as a reset
            else:
                _close(link.client)  # the server closed: the client reads what it sent, then EOF

    async def _to_server(self, link: _Link, client_in: asyncio.StreamReader) -> None:
        """Client to server, message by message, where a COMMIT may meet an armed trap."""
        split = _PostgresSplitter() if self.protocol == "postgresql" else _MySQLSplitter()
        broken = False
        try:
            while data := await client_in.read(_CHUNK):
                await link.flowing.wait()
                if link.closed:
                    break
                if link.delay:
                    await asyncio.sleep(link.delay)
                if link.hold_next:
                    held, link.hold_next = link.hold_next, 0.0
                    await asyncio.sleep(held)
                if self._freezes_left and self._freeze_needle in data:
                    self._freezes_left -= 1
                    self.frozen_at += 1
                    link.flowing.clear()
                    await link.flowing.wait()
                    break
                out = bytearray()
                for message, is_commit in split.feed(data):
                    if is_commit and (trap := self._take_trap()) is not None:
                        link.server.write(bytes(out))
                        self._spring(link, trap, message)
                        return
                    out += message
                link.server.write(bytes(out))
                await link.server.drain()
        except OSError:
            broken = True
        finally:
            if link.cut:
                pass  # _spring decided both sides' fates
            elif broken:
                link.abort()
            else:
                _close(link.server)  # the client closed: so does the proxy, toward the server

    def _take_trap(self) -> CommitTrap | None:
        while self._traps:
            trap = self._traps[0]
            if trap.left > 0:
                trap.left -= 1
                trap.taken += 1
                if trap.left == 0:
                    self._traps.pop(0)
                return trap
            self._traps.pop(0)
        return None

    def _spring(self, link: _Link, trap: CommitTrap, commit: bytes) -> None:
        """Cut ``link`` at its COMMIT as ``trap`` says: the client is reset, the server side waits."""
        link.cut = True
        if trap.mode == "drop-reply":
            link.server.write(commit)  # the server commits; its answer is dropped by _to_client
        link.abort(server=False)
        # The server side stays open until the server answers (drop-reply) or for a while (drop): a
        # backend whose client vanished mid-transaction, as after a real network failure.
        self._loop.loop.call_later(_ANSWER_WAIT_S, _close, link.server)
        trap.fired.set()
        if trap.then is not None:
            trap.then()


class _PostgresSplitter:
    """Splits a PostgreSQL client's byte stream into messages, and says which is a simple-query COMMIT."""

    def __init__(self) -> None:
        self._buffer = b""
        self._starting = True

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        self._buffer += data
        messages: list[tuple[bytes, bool]] = []
        while True:
            buffer = self._buffer
            if self._starting:  # untyped: Int32 length (itself included), Int32 code, ...
                if len(buffer) < 8:
                    break
                length = int.from_bytes(buffer[:4], "big")
                if len(buffer) < length:
                    break
                code = int.from_bytes(buffer[4:8], "big")
                messages.append((buffer[:length], False))
                self._buffer = buffer[length:]
                self._starting = code in (_SSL_REQUEST, _GSSENC_REQUEST)
                continue
            if len(buffer) < 5:  # typed: Byte1 type, Int32 length (itself included), body
                break
            total = 1 + int.from_bytes(buffer[1:5], "big")
            if len(buffer) < total:
                break
            message = buffer[:total]
            self._buffer = buffer[total:]
            messages.append((message, message[:1] == b"Q" and _is_commit_text(message[5:])))
        return messages


class _MySQLSplitter:
    """Splits a MySQL client's byte stream into packets, and says which is a COM_QUERY of COMMIT."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        self._buffer += data
        messages: list[tuple[bytes, bool]] = []
        while len(self._buffer) >= 4:  # Int24 payload length (little-endian), Int8 sequence, payload
            total = 4 + int.from_bytes(self._buffer[:3], "little")
            if len(self._buffer) < total:
                break
            packet = self._buffer[:total]
            self._buffer = self._buffer[total:]
            messages.append((packet, packet[4:5] == bytes([_COM_QUERY]) and _is_commit_text(packet[5:])))
        return messages


def _is_commit_text(text: bytes) -> bool:
    """``COMMIT`` as asyncpg (``COMMIT;``), libpq (``COMMIT``) and the MySQL drivers spell it."""
    return text.rstrip(b"\x00").strip().rstrip(b";").strip().upper() == b"COMMIT"


def _client_left(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether a client closed or reset its connection (a FIN read, even with data still unread)."""
    return writer.is_closing() or reader.at_eof() or bool(getattr(reader, "_eof", False))


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket with a reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _close(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket in order (FIN), if it is still open."""
    if not writer.transport.is_closing():
        writer.transport.close()
