"""Request bodies in and answers out, for the offload server, each under its size and time limits.

:func:`read_body` reads a body into one buffer of its declared size (no chunk list to join, so a
body costs its size once), reserving its bytes in the server's in-flight budget before reading
them and finishing within the body deadline. :func:`send` writes an answer's chunks (JSON header,
then the raw tensors, without joining them) within the same deadline, so a client that stops
reading cannot hold a request, its memory or its connection for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import PayloadEncodingError
from aiohttp.web_protocol import RequestPayloadError

from edgesplit.errors import RunInputError
from edgesplit.serve.guard import ByteBudget, Reservation

ENCODINGS = ("identity", "gzip", "deflate")
LINGER_MAX_NBYTES = (
    1 << 20
)  # refused early with more unread than this: close rather than read the rest


class BufferPool:
    """Body buffers of 1 MB and more, kept for reuse after their request.

    Memory fresh from the kernel costs a page fault per 4 KB on first touch; in a virtual machine
    that can be 25 us, so filling a new 60 MB buffer held the event loop for 0.4 s. A reused buffer
    is already mapped. The buffers kept and the bodies in flight together stay within the
    ``budget``'s limit, so the pool adds no memory beyond it. A buffer goes back only when nothing
    can still read it (see the server).
    """

    MIN_NBYTES = 1 << 20

    def __init__(self, budget: ByteBudget):
        self.budget = budget
        self._free: list[np.ndarray] = []  # oldest first
        self._free_nbytes = 0

    def take(self, nbytes: int) -> memoryview:
        """A writable buffer of exactly ``nbytes`` (a view of a pooled one when one fits)."""
        if nbytes < self.MIN_NBYTES:
            return memoryview(np.empty(nbytes, np.uint8))
        fits = [b for b in self._free if nbytes <= b.size <= 2 * nbytes]
        if fits:
            buf = min(fits, key=lambda b: b.size)
            self._free.remove(buf)
            self._free_nbytes -= buf.size
        else:
            buf = np.empty(-(-nbytes // self.MIN_NBYTES) * self.MIN_NBYTES, np.uint8)
            self._trim()
        return memoryview(buf)[:nbytes]

    def give(self, view: memoryview) -> None:
        """Keep the buffer under ``view`` for reuse; the caller guarantees nothing reads it any
        more."""
        buf = view.obj
        if isinstance(buf, np.ndarray) and buf.size >= self.MIN_NBYTES:
            self._free.append(buf)
            self._free_nbytes += buf.size
            self._trim()

    def _trim(self) -> None:
        while self._free and self._free_nbytes + self.budget.used_nbytes > self.budget.limit_nbytes:
            self._free_nbytes -= self._free.pop(0).size


class Limits(Protocol):
    max_request_nbytes: int
    body_timeout_s: float


class Refused(Exception):
    """A request answered with ``status`` and a JSON message; ``close``: drop the connection after.

    A connection whose body was not read is closed when more than :data:`LINGER_MAX_NBYTES` of it
    remain (aiohttp would otherwise read and discard the rest, for up to 10 s); with less, the rest
    is read so that the client, still sending, sees the answer.
    """

    def __init__(
        self,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
        close: bool | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        self.close = status in (408, 413) if close is None else close


def _reserve(held: Reservation, nbytes: int, unread_nbytes: int) -> None:
    if held.take(nbytes):
        return
    limit = held.budget.limit_nbytes
    if held.nbytes + nbytes > limit:
        raise Refused(413, f"request body over the in-flight limit of {limit} bytes")
    raise Refused(
        503,
        f"too many request bytes in flight ({held.budget.used_nbytes} of {limit}); retry later",
        {"Retry-After": "1"},
        close=unread_nbytes > LINGER_MAX_NBYTES,
    )


async def read_body(
    request: web.Request,
    limits: Limits,
    held: Reservation,
    check_head: tuple[int, Callable[[memoryview, int | None], int]] | None = None,
    pool: BufferPool | None = None,
) -> memoryview:
    """The request body (decompressed), within the size limit, the byte budget and the body
    deadline.

    ``check_head``: ``(n, check)``; once the first ``n`` bytes (the JSON header of a binary request)
    are in, ``check(head, nbytes_after_head or None)`` may refuse the request before the rest is
    read;
    it returns the bytes of tensors the header declares, and a body of unknown size (chunked) may
    not hold more than that after its header.
    """
    limit = limits.max_request_nbytes
    declared = request.content_length
    if declared is not None and declared > limit:
        raise Refused(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if (
        encoding not in ENCODINGS
    ):  # aiohttp inflates gzip and deflate itself; the limit counts inflated bytes
        raise Refused(
            415, f"unsupported Content-Encoding {encoding[:40]!r} (use {', '.join(ENCODINGS)})"
        )
    size = declared if encoding == "identity" else None
    if size is not None:
        _reserve(held, size, size)
    if check_head is not None and check_head[0] > (limit if size is None else size):
        check_head = None
    # np.empty: pages are not touched before the body fills them (bytearray(n) would zero them here)
    fixed = pool.take(size or 0) if pool is not None else memoryview(np.empty(size or 0, np.uint8))
    grown = bytearray()
    pos = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            while chunk := await request.content.readany():
                n = len(chunk)
                if size is not None:
                    fixed[pos : pos + n] = chunk  # aiohttp never hands more than Content-Length
                else:
                    if pos + n > limit:
                        raise Refused(413, f"request body is over the limit of {limit} bytes")
                    _reserve(held, n, 0)
                    grown += chunk
                pos += n
                if check_head is not None and pos >= check_head[0]:
                    head_nbytes, check = check_head
                    check_head = None
                    head = bytes(
                        (fixed if size is not None else grown)[:head_nbytes]
                    )  # at most 64 KB
                    try:
                        declared = check(
                            memoryview(head), None if size is None else size - head_nbytes
                        )
                    except RunInputError as e:
                        unread = limit if size is None else size - pos
                        raise Refused(400, str(e), close=unread > LINGER_MAX_NBYTES) from e
                    if size is None:
                        limit = min(limit, head_nbytes + declared)
    except TimeoutError:
        raise Refused(
            408, f"request body not received within {limits.body_timeout_s:g} s"
        ) from None
    except (PayloadEncodingError, RequestPayloadError) as e:
        raise RunInputError(f"the body is not valid {encoding} data ({e})") from e
    if size is not None and pos != size:
        raise RunInputError(f"the body ended after {pos} of {size} bytes")
    return fixed if size is not None else memoryview(grown)


async def send(
    request: web.Request,
    chunks: Sequence[bytes | memoryview],
    headers: Mapping[str, str],
    content_type: str,
    timeout_s: float,
) -> web.StreamResponse:
    """Write an answer of ``chunks`` within ``timeout_s``; a client too slow to read it is
    dropped."""
    resp = web.StreamResponse(headers=headers)
    resp.content_type = content_type
    resp.content_length = sum(len(c) for c in chunks)
    try:
        async with asyncio.timeout(timeout_s):
            await resp.prepare(request)
            for c in chunks:
                await resp.write(c)
            await resp.write_eof()
    except (TimeoutError, ConnectionError):
        if request.transport is not None:
            request.transport.close()
    return resp


async def send_and_close(request: web.Request, resp: web.Response) -> None:
    """Send ``resp``, then close the connection without reading what is left of the request body.

    aiohttp would read and discard the rest for up to 10 s (its lingering close); for a body known
    to
    be large that is work spent on a request already refused. A client still sending may then see
    the connection reset rather than the answer.
    """
    resp.force_close()
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:
        pass
    request.protocol.force_close()
