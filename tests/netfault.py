"""A fault of the network, not a mock of synclane: a TCP proxy in front of PostgreSQL that can
let a statement commit and then lose its answer.

Armed with a marker, the proxy passes on the next client message that contains it, holds back
everything the server sends in reply until the server says it is ready for the next query (by
then an autocommit statement has committed), and then cuts the client's connection without
passing the answer on. The client sees a broken connection and cannot know whether the statement
went through. Connections use sslmode=disable so that the stream is plain protocol messages.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class AnswerDropper:
    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        host = str(params.get("host") or "127.0.0.1").split(",")[0]
        server_port = int(str(params.get("port") or 5432).split(",")[0])
        # The server may listen on a Unix socket (the embedded one does): its path is the host.
        self._target: str | tuple[str, int] = (
            f"{host}/.s.PGSQL.{server_port}" if host.startswith("/") else (host, server_port)
        )
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=port, sslmode="disable")
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        self.dropped = 0
        self._closed = False
        self._sockets: list[socket.socket] = []  # each relayed connection's two ends
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def drop_answer_to(self, marker: str) -> None:
        """The next client message containing `marker` runs; its answer never arrives."""
        with self._lock:
            self._marker = marker.encode()

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._marker is not None

    def close(self) -> None:
        """Stop accepting, cut every relayed connection and wait for the proxy's threads: a
        listening socket closed under a thread blocked in accept() does not wake it on Linux,
        and a relay waits for as long as its connection lives, so each would outlive the test."""
        self._closed = True
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() with an error
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)
        for thread in self._threads:
            thread.join(timeout=5)
            assert not thread.is_alive(), f"the proxy's {thread.name} did not stop"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = self._connect_upstream()
            doomed = threading.Event()
            relays = [
                threading.Thread(target=self._upstream, args=(client, server, doomed), daemon=True),
                threading.Thread(
                    target=self._downstream, args=(server, client, doomed), daemon=True
                ),
            ]
            with self._lock:
                if self._closed:  # closed while this connection came in
                    _close(client)
                    _close(server)
                    return
                self._sockets += [client, server]
                self._threads += relays
            for relay in relays:
                relay.start()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self._target, str):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self._target)
            return server
        return socket.create_connection(self._target)

    def _upstream(
        self, client: socket.socket, server: socket.socket, doomed: threading.Event
    ) -> None:
        # This connection's prepared statements (name -> text): a statement prepared on an
        # earlier use runs by name alone (a Bind), without its text.
        prepared: dict[bytes, bytes] = {}
        try:
            while data := client.recv(65536):
                prepared.update(_parsed(data))
                with self._lock:
                    if self._marker is not None and _runs(data, self._marker, prepared):
                        self._marker = None
                        doomed.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)

    def _downstream(
        self, server: socket.socket, client: socket.socket, doomed: threading.Event
    ) -> None:
        buffer = b""
        try:
            while data := server.recv(65536):
                if not doomed.is_set():
                    client.sendall(data)
                    continue
                # Hold the answer back until ReadyForQuery ('Z'): the statement has committed.
                buffer += data
                if _has_ready_for_query(buffer):
                    self.dropped += 1
                    break
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)


def _messages(stream: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The (kind, body) of each whole frontend message in `stream`."""
    offset = 0
    while offset + 5 <= len(stream):
        kind = stream[offset : offset + 1]
        (length,) = struct.unpack("!I", stream[offset + 1 : offset + 5])
        yield kind, stream[offset + 5 : offset + 1 + length]
        offset += 1 + length


def _parsed(stream: bytes) -> dict[bytes, bytes]:
    """The named statements a client prepares in `stream` (Parse: name, then text)."""
    found = {}
    for kind, body in _messages(stream):
        if kind == b"P":
            name, _, rest = body.partition(b"\0")
            if name:
                found[name] = rest.partition(b"\0")[0]
    return found


def _runs(stream: bytes, marker: bytes, prepared: dict[bytes, bytes]) -> bool:
    """Whether `stream` runs a statement whose text holds `marker`: sent as text, or bound by
    the name of one prepared earlier (Bind: portal, then statement name)."""
    if marker in stream:
        return True
    for kind, body in _messages(stream):
        if kind == b"B":
            name = body.split(b"\0", 2)[1]
            if marker in prepared.get(name, b""):
                return True
    return False


def _has_ready_for_query(stream: bytes) -> bool:
    return any(kind == b"Z" for kind, _ in _messages(stream))


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@contextmanager
def answer_dropper(dsn: str) -> Iterator[AnswerDropper]:
    proxy = AnswerDropper(dsn)
    try:
        yield proxy
    finally:
        proxy.close()
