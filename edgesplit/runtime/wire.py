"""HTTP/1.1 connections for the offload client whose every read waits at most until a deadline.

``http.client`` sets one socket timeout per read, so a server that trickles a byte at a time (in
the status line, the headers, a chunk-size line or the body) can stretch a call without end.
:class:`Connection` reads each response through :class:`DeadlineReader`, which sets the socket
timeout to what is left of :attr:`Connection.deadline` before every read, so the whole answer
arrives by the deadline or the read raises ``TimeoutError``. :func:`read_body` reads a declared or
chunked body and refuses it (:class:`TooLarge`) as soon as it is known to pass a limit.
"""

from __future__ import annotations

import http.client
import io
import math
import socket
import time

MB = 1 << 20


def remaining_s(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic``); ``TimeoutError`` when none are."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the deadline passed")
    return remaining


class DeadlineReader(io.RawIOBase):
    """The socket's reader for one response: each read waits at most until the connection's
    deadline."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, conn: Connection):
        self._raw, self._sock, self._conn = raw, sock, conn

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        self._sock.settimeout(remaining_s(self._conn.deadline))
        return self._raw.readinto(b)  # type: ignore[return-value]

    def close(self) -> None:
        self._raw.close()  # releases the socket's reference, as http.client's own reader does
        super().close()


class Connection(http.client.HTTPConnection):
    """An HTTP connection whose responses are read under :attr:`deadline` (``time.monotonic``)."""

    deadline = math.inf

    @property
    def response_class(self):  # type: ignore[override]
        conn = self

        def make(sock: socket.socket, *args, **kwargs) -> http.client.HTTPResponse:
            resp = http.client.HTTPResponse(sock, *args, **kwargs)
            raw = (
                resp.fp.detach()
            )  # nothing is buffered yet; the reader keeps the socket's reference
            resp.fp = io.BufferedReader(DeadlineReader(raw, sock, conn), 1 << 16)  # type: ignore[arg-type]
            return resp

        return make


class HTTPSConnection(Connection, http.client.HTTPSConnection):
    """:class:`Connection` over TLS."""


class TooLarge(Exception):
    """An answer larger than the caller allows."""


def read_body(resp: http.client.HTTPResponse, limit: int) -> bytearray:
    """The body, declared or chunked, refused as soon as it is known to pass ``limit`` bytes."""
    length = resp.length
    if length is not None:
        if length > limit:
            raise TooLarge(f"the answer declares {length} bytes, over the limit of {limit} bytes")
        body = bytearray(length)
        view, pos = memoryview(body), 0
        while pos < length:
            n = resp.readinto(view[pos : pos + MB])
            if not n:
                raise http.client.IncompleteRead(bytes(0), length - pos)
            pos += n
        return body
    body = bytearray()  # chunked or delimited by close: read what comes, up to the limit
    while chunk := resp.read1(MB):
        if len(body) + len(chunk) > limit:
            raise TooLarge(f"the answer runs past the limit of {limit} bytes")
        body += chunk
    return body
