"""Request bodies in and answers out, for the offload server, each under its size and time limits.

:func:`read_body` reads a body into one buffer of its declared size (no chunk list to join, so a
body costs its size once), reserving its bytes in the server's in-flight budget before reading
them and finishing within the body deadline. :func:`send` writes an answer's chunks (JSON header,
then the raw tensors, without joining them) within the same deadline, so a client that stops
reading cannot hold a request, its memory or its connection for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import PayloadEncodingError
from aiohttp.web_protocol import RequestPayloadError

from edgesplit.errors import RunInputError
from edgesplit.runtime.guard import Reservation

ENCODINGS = ("identity", "gzip", "deflate")


class Limits(Protocol):
    max_request_nbytes: int
    body_timeout_s: float


class Refused(Exception):
    """A request answered with ``status`` and a JSON message; ``close``: drop the connection after."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        self.close = status in (408, 413)


def _reserve(held: Reservation, nbytes: int) -> None:
    if held.take(nbytes):
        return
    limit = held.budget.limit_nbytes
    if held.nbytes + nbytes > limit:
        raise Refused(413, f"request body over the in-flight limit of {limit} bytes")
    raise Refused(
        503,
        f"too many request bytes in flight ({held.budget.used_nbytes} of {limit}); retry later",
        {"Retry-After": "1"},
    )


async def read_body(request: web.Request, limits: Limits, held: Reservation) -> memoryview:
    """The request body (decompressed), within the size limit, the byte budget and the body deadline."""
    limit = limits.max_request_nbytes
    declared = request.content_length
    if declared is not None and declared > limit:
        raise Refused(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ENCODINGS:  # aiohttp inflates gzip and deflate itself; the limit counts inflated bytes
        raise Refused(415, f"unsupported Content-Encoding {encoding[:40]!r} (use {', '.join(ENCODINGS)})")
    size = declared if encoding == "identity" else None
    if size is not None:
        _reserve(held, size)
    # np.empty: pages are not touched before the body fills them (bytearray(n) would zero them here)
    fixed = memoryview(np.empty(size or 0, np.uint8))
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
                    _reserve(held, n)
                    grown += chunk
                pos += n
    except TimeoutError:
        raise Refused(408, f"request body not received within {limits.body_timeout_s:g} s") from None
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
    """Write an answer of ``chunks`` within ``timeout_s``; a client too slow to read it is dropped."""
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
