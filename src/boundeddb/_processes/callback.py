"""
The callback port of a ProcessRunner on Dask: where its tasks connect back to this process.

A task proves that it knows the runner's key, as with multiprocessing's ``Listener`` and ``Client``,
and this process proves it too. Then the task names itself with its token. When the Dask client uses
TLS, the connection is TLS from its first byte, with the cluster's certificates, and the key is
checked inside it. The listening thread only accepts: each peer's handshake runs in a thread of its
own with a deadline, so that a peer that stays silent, sends garbage or fails the check holds up no
other. Such a peer is refused and logged once at WARNING with its address.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["HANDSHAKE_TIMEOUT_S", "CallbackListener", "Channel", "connect"]

logger = logging.getLogger("boundeddb.processes")

#: How many seconds a peer of the callback port has for its whole handshake: TLS, key and token.
HANDSHAKE_TIMEOUT_S = 10.0
#: The most bytes read from the socket at once.
_CHUNK = 65536


class Channel(Connection):
    """
    A ``Connection`` over a TCP socket, in TLS or not, whose reads and writes can have a deadline.

    It frames messages as ``Connection`` does, and is one, so that the worker, the fleet and
    multiprocessing's ``deliver_challenge`` and ``answer_challenge`` use it unchanged. It replaces the
    four methods that touch the file descriptor. TLS runs on an :class:`ssl.SSLObject` over memory
    buffers: a reader thread and writer threads share the connection, and an ``SSLObject`` is not for
    two threads at once. So each use of it is under a lock, and the socket's reads and writes are not.
    """

    def __init__(self, sock: socket.socket, deadline: float | None) -> None:
        super().__init__(sock.fileno())
        self._sock = sock
        self._deadline = deadline
        # Send each message at once: else Nagle's algorithm holds a small one back until the previous
        # one is acknowledged, which the peer delays up to 40 ms.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._tls: ssl.SSLObject | None = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls_lock = threading.Lock()
        self._send_lock = threading.Lock()
        #: Bytes received, decrypted, and not read yet. Only the reading thread touches them.
        self._plain = bytearray()
        self._eof = False

    def start_tls(self, context: ssl.SSLContext, *, server_side: bool) -> None:
        """Run the TLS handshake: from now on, every byte is encrypted. Before any other thread uses it."""
        tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        try:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._write_raw(self._outgoing.read())
                    data = self._read_raw()
                    if not data:
                        raise EOFError("the peer closed the connection during the TLS handshake") from None
                    self._incoming.write(data)
        finally:
            with contextlib.suppress(OSError):  # our last flight, or the alert that says why we fail
                self._write_raw(self._outgoing.read())
        self._tls = tls

    def settle(self) -> None:
        """The handshake is over: no deadline any more."""
        self._deadline = None
        self._sock.settimeout(None)

    # -- the socket -----------------------------------------------------------------------------------

    def _timeout(self) -> None:
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the handshake's deadline passed")
            self._sock.settimeout(left)

    def _read_raw(self) -> bytes:
        self._timeout()
        return self._sock.recv(_CHUNK)

    def _write_raw(self, data: ReadableBuffer) -> None:
        if data:
            self._timeout()
            self._sock.sendall(data)

    def _fill(self) -> None:
        """Read from the socket once, blocking, into the plain bytes: none may come of it, or the end."""
        data = self._read_raw()
        if not data:
            self._eof = True
            return
        if self._tls is None:
            self._plain += data
            return
        with self._tls_lock:
            self._incoming.write(data)
            try:
                while chunk := self._tls.read(_CHUNK):
                    self._plain += chunk
                self._eof = True
            except ssl.SSLWantReadError:  # the rest of a record is still on its way
                pass
            except ssl.SSLZeroReturnError:  # the peer closed TLS
                self._eof = True
            answer = self._outgoing.pending  # reading may call for an answer, such as a key update
        if answer:
            self._send(b"")

    # -- what Connection calls ------------------------------------------------------------------------

    def _send(self, buf: ReadableBuffer) -> None:
        with self._send_lock:  # records go out in the order they were made
            if self._tls is not None:
                with self._tls_lock:
                    if len(memoryview(buf)):
                        self._tls.write(buf)
                    buf = self._outgoing.read()
            self._write_raw(buf)

    def _recv(self, size: int) -> io.BytesIO:
        while len(self._plain) < size:
            if self._eof:
                if self._plain:
                    raise OSError("got end of file during message")
                raise EOFError
            self._fill()
        data = bytes(self._plain[:size])
        del self._plain[:size]
        return io.BytesIO(data)

    def _poll(self, timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self._plain and not self._eof:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not wait([self._sock], left):
                return False
            self._fill()
        return True

    def _close(self) -> None:
        with contextlib.suppress(OSError):  # both ways, so that a thread reading it, here or there, ends
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def connect(address: tuple[str, int], authkey: bytes, context: ssl.SSLContext | None) -> Channel:
    """The task's side: connect to the callback port, in TLS with ``context``, and prove the key both ways."""
    sock = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    channel = Channel(sock, time.monotonic() + HANDSHAKE_TIMEOUT_S)
    try:
        if context is not None:
            channel.start_tls(context, server_side=False)
        answer_challenge(channel, authkey)
        deliver_challenge(channel, authkey)
    except BaseException:
        channel.close()
        raise
    channel.settle()
    return channel


def _why(error: Exception) -> str:
    """Why a peer's handshake failed, for the log."""
    if isinstance(error, TimeoutError):
        return f"no complete handshake within {HANDSHAKE_TIMEOUT_S} s"
    if isinstance(error, ssl.SSLError):
        return f"its TLS handshake failed ({error.reason or error})"
    if isinstance(error, AuthenticationError):
        return "it does not know the runner's key"
    if isinstance(error, (EOFError, ConnectionError)):
        return "it closed the connection during the handshake"
    return f"its handshake is malformed ({type(error).__name__}: {error})"


def _describe(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer)


class CallbackListener:
    """
    The callback port on ``host``: each peer that passes the handshake goes to ``arrived``, with its token.

    The handshake is TLS with ``context`` when there is one, then the key both ways, then the token,
    all within :data:`HANDSHAKE_TIMEOUT_S`. It binds to ``host`` only, never to every interface.
    """

    def __init__(
        self,
        host: str,
        authkey: bytes,
        context: ssl.SSLContext | None,
        arrived: Callable[[bytes, Channel], None],
    ) -> None:
        self._authkey = authkey
        self._context = context
        self._arrived = arrived
        self._server = socket.create_server((host, 0), backlog=128)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._closed = False
        self._lock = threading.Lock()
        #: The sockets of the peers in their handshake, to end when the listener closes.
        self._greeting: set[socket.socket] = set()
        self._accepting = threading.Thread(target=self._accept, name="boundeddb-dask-accept", daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._server.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.1)  # out of file descriptors, say: try again soon, without spinning
                continue
            if self._closed:  # close()'s poke
                sock.close()
                return
            with self._lock:
                self._greeting.add(sock)
            threading.Thread(
                target=self._greet, args=(sock, peer), name="boundeddb-dask-handshake", daemon=True
            ).start()

    def _greet(self, sock: socket.socket, peer: object) -> None:
        """In a thread of its own: the peer's handshake, within the deadline."""
        try:
            channel = Channel(sock, time.monotonic() + HANDSHAKE_TIMEOUT_S)
            if self._context is not None:
                channel.start_tls(self._context, server_side=True)
            deliver_challenge(channel, self._authkey)
            answer_challenge(channel, self._authkey)
            token = channel.recv_bytes(256)
        except Exception as error:
            sock.close()
            if not self._closed:
                logger.warning(
                    "refused a connection to the callback port %s from %s: %s",
                    _describe(self.address),
                    _describe(peer),
                    _why(error),
                )
            return
        finally:
            with self._lock:
                self._greeting.discard(sock)
        channel.settle()
        self._arrived(token, channel)

    def close(self) -> None:
        """Stop accepting, and end the handshakes in progress."""
        self._closed = True
        with self._lock:
            greeting = list(self._greeting)
        for sock in greeting:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):  # wake the accepting thread: closing alone does not
            socket.create_connection(self.address, timeout=1.0).close()
        self._accepting.join(5.0)
        self._server.close()
