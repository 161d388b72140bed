"""Connection-level limits of the offload server: a connection cap, a header timeout, a byte budget.

aiohttp bounds the size of a request line and of headers, and closes a connection that stays idle
for ``keepalive_timeout`` (about an hour by default); it has no cap on connections, no deadline
for the headers of a request, and no budget for the bodies held in memory. This module adds them
at the socket, below the application:

* :class:`GuardedHandler` is aiohttp's HTTP protocol with a header deadline: a connection's first
  request must have its headers complete within ``header_timeout_s`` of the connection opening, and
  each later one (on a kept-alive connection) within ``header_timeout_s`` of its first byte, else it
  is answered ``408`` and closed. A client that connects and sends nothing, or a part of its
  headers, holds a socket for that long, not for the idle timeout or an hour.
* :class:`ConnectionGuard` counts connections. At ``max_connections``, a new connection closes the
  oldest one that has no request in progress (idle keep-alive, or still sending its headers), as
  nginx drains idle connections; when every connection is busy, the new one is answered ``503``
  and closed. Either way the process never runs out of file descriptors, so health checks and
  real clients still get in while idle sockets pile up.
* :class:`ByteBudget` is the number of request-body bytes all requests may hold at once.
* :class:`GuardedSite` listens with :class:`GuardedHandler`, as aiohttp's ``TCPSite`` would, behind
  a :class:`~edgesplit.serve.frontdoor.FrontDoor` that answers health probes on new connections
  off the event loop and hands every other connection to it.

Every refusal carries a JSON body ``{"error": ...}``, as the application's own do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
from collections import OrderedDict
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from edgesplit.serve.frontdoor import FRONT_DOOR_FDS, FrontDoor

log = logging.getLogger("edgesplit.serve")


LISTEN_QUEUE = 1024  # connections the kernel queues until they are accepted


def default_max_connections(reserve_fds: int = 64, ceiling: int = 1024) -> int:
    """A connection cap that fits this process's file-descriptor limit.

    It leaves ``reserve_fds`` for the process's own files, and 128 more: the front door holds up to
    :data:`~edgesplit.serve.frontdoor.FRONT_DOOR_FDS` sockets that are not yet connections of the
    loop, and a connection closed at the cap (to make room) is closed an iteration of the loop
    later.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ceiling
    return max(8, min(ceiling, soft - reserve_fds - max(128, FRONT_DOOR_FDS)))


def raw_response(status: int, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 answer with a JSON error body, for use below
    aiohttp."""
    body = json.dumps({"error": message}).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ByteBudget:
    """Bytes that request bodies may hold at once, across all requests (used on the event loop
    only)."""

    def __init__(self, limit_nbytes: int):
        self.limit_nbytes = limit_nbytes
        self.used_nbytes = 0
        self.peak_nbytes = 0

    def take(self, nbytes: int) -> bool:
        """Reserve ``nbytes``; False (nothing reserved) when that would pass the limit."""
        if self.used_nbytes + nbytes > self.limit_nbytes:
            return False
        self.used_nbytes += nbytes
        self.peak_nbytes = max(self.peak_nbytes, self.used_nbytes)
        return True

    def give(self, nbytes: int) -> None:
        self.used_nbytes -= nbytes

    def reservation(self) -> Reservation:
        return Reservation(self)


class Reservation:
    """What one request holds of a :class:`ByteBudget`; :meth:`release` gives it all back."""

    def __init__(self, budget: ByteBudget):
        self.budget = budget
        self.nbytes = 0

    def take(self, nbytes: int) -> bool:
        if not self.budget.take(nbytes):
            return False
        self.nbytes += nbytes
        return True

    def release(self) -> None:
        self.budget.give(self.nbytes)
        self.nbytes = 0


class ConnectionGuard:
    """Which connections are open, which of them have a request in progress, and the cap on them."""

    def __init__(self, max_connections: int, header_timeout_s: float):
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self._idle: OrderedDict[GuardedHandler, None] = OrderedDict()  # oldest idle first
        self._busy: set[GuardedHandler] = set()
        self.evicted = 0
        self.refused = 0
        self.header_timeouts = 0

    @property
    def open(self) -> int:
        return len(self._idle) + len(self._busy)

    @property
    def in_request(self) -> int:
        """Connections with a request in progress."""
        return len(self._busy)

    def admit(self, conn: GuardedHandler) -> bool:
        """Make room for ``conn`` (closing the oldest idle connection at the cap); False if none."""
        if self.open >= self.max_connections:
            if not self._idle:
                self.refused += 1
                return False
            oldest, _ = self._idle.popitem(last=False)
            self.evicted += 1
            oldest.close_now()
        self._idle[conn] = None
        return True

    def busy(self, conn: GuardedHandler) -> bool:
        return conn in self._busy

    def request_started(self, conn: Any) -> None:
        """The application took a request on ``conn`` (its headers are complete)."""
        if isinstance(conn, GuardedHandler) and conn in self._idle:
            del self._idle[conn]
            self._busy.add(conn)
            conn.cancel_header_timer()

    def request_finished(self, conn: Any) -> None:
        if isinstance(conn, GuardedHandler) and conn in self._busy:
            self._busy.discard(conn)
            self._idle[conn] = None  # newest idle: the last to be closed at the cap

    def lost(self, conn: GuardedHandler) -> None:
        self._idle.pop(conn, None)
        self._busy.discard(conn)


class GuardedHandler(RequestHandler):
    """aiohttp's HTTP/1.1 protocol, admitted by a :class:`ConnectionGuard`, with a header deadline.

    Errors aiohttp raises before the application sees a request (a malformed request line, headers
    too long or too many) are answered with a JSON body like every other error, and logged at
    debug level only: a client cannot fill the log.
    """

    def __init__(self, guard: ConnectionGuard, manager: web.Server, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = False
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(self):
            assert isinstance(transport, asyncio.Transport)
            transport.write(raw_response(503, "too many connections", {"Retry-After": "1"}))
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        # the first request's headers are due from the connection's start
        self._start_header_timer()

    def data_received(self, data: bytes) -> None:
        if data and not self._guard.busy(self):
            self._start_header_timer()
        super().data_received(data)

    def _start_header_timer(self) -> None:
        if self._header_timer is None and self.transport is not None:
            self._header_timer = self._loop.call_later(
                self._guard.header_timeout_s, self._headers_too_slow
            )

    def connection_lost(self, exc: BaseException | None) -> None:
        self.cancel_header_timer()
        if self._admitted:
            self._guard.lost(self)
            super().connection_lost(exc)

    def cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def close_now(self) -> None:
        """Close at once (evicted at the cap); the guard has already forgotten this connection."""
        self.cancel_header_timer()
        self.force_close()

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._guard.busy(self) or self.transport is None:
            return
        self._guard.header_timeouts += 1
        limit = self._guard.header_timeout_s
        self.transport.write(raw_response(408, f"request headers not complete within {limit:g} s"))
        self.force_close()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        log.debug("refused a malformed request from %s: %s", request.remote, exc or message)
        if status >= 500:
            text = HTTPStatus(status).phrase.lower()
        else:  # aiohttp's message for a bad request names the problem, never our internals
            text = (
                message or getattr(exc, "message", None) or HTTPStatus(status).phrase
            ).splitlines()[0]
        resp = web.json_response(
            {"error": f"bad request: {text[:200]}"} if status == 400 else {"error": text}
        )
        resp.set_status(status)
        resp.force_close()
        return resp


class GuardedSite(web.BaseSite):
    """A TCP listener whose connections are :class:`GuardedHandler` built by ``factory``.

    The listening socket belongs to a :class:`~edgesplit.serve.frontdoor.FrontDoor` thread, which
    answers health probes on new connections from ``ready`` and hands every other connection to the
    event loop; :attr:`front_door` counts what it did.
    """

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        factory: Callable[[], GuardedHandler],
        ready: Callable[[], bool],
    ):
        super().__init__(runner)
        self._host, self._port, self._factory, self._ready = host, port, factory, ready
        self.bound_port: int | None = None
        self.front_door: FrontDoor | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.bound_port or self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        family = socket.getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        sock = socket.create_server(
            (self._host, self._port), family=family[0][0], backlog=LISTEN_QUEUE
        )
        self.bound_port = int(sock.getsockname()[1])
        self.front_door = FrontDoor(sock, loop, self._factory, self._ready)
        self.front_door.start()

    async def stop(self) -> None:
        if self.front_door is not None:
            self.front_door.stop()
            await self.front_door.settle()
        await super().stop()
