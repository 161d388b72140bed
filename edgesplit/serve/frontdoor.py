"""The offload server's front door: health probes on new connections answered off the event loop.

Why it exists: the server is aiohttp on one event loop, and a probe (a load balancer's, Kubernetes')
that opens a new connection waited for the loop's turn behind every busy client: with 64 clients
and an attack under way, ``GET /v2/health/ready`` took 144 ms at p99 (``benchmarks/server_load.py``;
the goal is 50 ms). So a thread owns the listening socket. For each new connection it peeks at
the first bytes (``MSG_PEEK``: nothing is consumed), waiting at most :data:`PEEK_WAIT_S` for them:

* exactly one complete ``GET /v2/health/live`` or ``/v2/health/ready`` (headers ended, no body,
  nothing after it) is answered here, 200 or 503 from the server's readiness, ``Connection:
  close``; health stays open with a token, as in the application;
* anything else (another request, a prefix that can no longer be a health request, a body, a
  pipelined request, garbage, or no complete health request after the wait) is handed to the
  event loop unchanged, as a connection the loop had accepted itself, so every limit of
  :mod:`edgesplit.serve.guard` applies to it. Health requests on an open keep-alive connection
  are aiohttp's, as before.

The thread never blocks on a client: sockets are non-blocking, at most :data:`MAX_PEEKING` wait at
once (past it the oldest is handed off), and one that has sent a part of a health request is
peeked again every :data:`REPEEK_S` rather than watched (its unread bytes would wake the selector
at once, again and again). It holds the GIL only for a few short calls per connection; the server
lowers the switch interval (:data:`SWITCH_INTERVAL_S`) so that it gets the GIL soon from a busy
loop.
Measured once each on the shared 2-core machine (noisy, load average 8-12): probe p99 9-32 ms with
the front door and a 1 ms interval, 18 ms with Python's 5 ms (so the interval is margin, not the
fix), 144 ms before the front door.
Everything else is aiohttp's: this parses only the few fixed request lines it answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger("edgesplit.serve")

PEEK_WAIT_S = 0.05  # how long a new connection may take to send a whole health request
REPEEK_S = 0.005  # how often a connection that sent part of a health request is looked at again
MAX_PEEKING = 32  # connections waiting for their first bytes at once
MAX_IN_TRANSIT = 32  # connections handed to the loop and not yet taken: past it, no accepting
MAX_HEAD_NBYTES = 2048  # a health request with longer headers goes to aiohttp
MAX_HEADERS = 32  # or with more header lines (aiohttp refuses past 128)
ACCEPT_PAUSE_S = 0.01  # after an accept fails for want of file descriptors
SWITCH_INTERVAL_S = 0.001  # Python's default, 5 ms, is the wait for the GIL after each wake-up

FRONT_DOOR_FDS = MAX_PEEKING + 2 * MAX_IN_TRANSIT  # the most sockets the front door holds at once

_LINES = {
    f"GET /v2/health/{kind} HTTP/1.{minor}".encode(): kind
    for kind in ("live", "ready")
    for minor in (0, 1)
}
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
WAIT = "wait"


def classify(data: bytes) -> str | None:
    """What the first bytes of a connection are: ``"live"`` or ``"ready"`` (one whole health request
    and nothing after it), :data:`WAIT` (they may still become one), or None (hand them off)."""
    end = data.find(b"\r\n\r\n")
    line, crlf, headers = (data if end < 0 else data[:end]).partition(b"\r\n")
    if not crlf and end < 0:  # the request line is not complete yet
        return WAIT if any(known.startswith(data) for known in _LINES) else None
    kind = _LINES.get(line)
    if kind is None or len(data) > MAX_HEAD_NBYTES:
        return None
    if end < 0:
        return WAIT
    if end + 4 != len(data):  # a body, or a second request, follows
        return None
    lines = headers.split(b"\r\n") if headers else []
    if len(lines) > MAX_HEADERS:
        return None
    names = []
    for header in lines:  # what aiohttp's parser refuses with 400 is aiohttp's to answer
        name, colon, value = header.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            return None
        names.append(name.lower())
        if names[-1] == b"transfer-encoding" or (
            names[-1] == b"content-length" and value.strip() != b"0"
        ):
            return None
    hosts = names.count(b"host")  # HTTP/1.1 needs exactly one
    if names.count(b"content-length") > 1 or hosts > 1 or (hosts == 0 and line.endswith(b"1.1")):
        return None
    return kind


def health_answer(kind: str, ready: bool) -> bytes:
    """The whole answer to a health request, as the application gives it (with ``Connection:
    close``)."""
    ok = kind == "live" or ready
    body = json.dumps({kind: ok}).encode()
    head = (
        f"HTTP/1.1 {'200 OK' if ok else '503 Service Unavailable'}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class FrontDoor:
    """A thread that accepts on ``sock``, answers health probes, and hands everything else to
    ``loop``.

    Args:
        sock: a listening TCP socket; the front door owns it from :meth:`start` and closes it in
            :meth:`stop`.
        loop: the event loop that serves every connection not answered here.
        protocol_factory: what the loop builds for a connection handed to it, as for
            ``loop.create_server``.
        ready: whether the server is ready (read on this thread).
    """

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        protocol_factory: Callable[[], asyncio.Protocol],
        ready: Callable[[], bool],
    ):
        self._sock, self._loop, self._factory, self._ready = sock, loop, protocol_factory, ready
        sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._waiting: OrderedDict[socket.socket, float] = (
            OrderedDict()
        )  # -> deadline, oldest first
        self._partial: set[socket.socket] = (
            set()
        )  # sent part of a health request: peeked, not watched
        self._lock = threading.Lock()
        self._in_transit = 0
        self._accepting = False
        self._paused_until = 0.0
        self._stopping = False
        self._tasks: set[asyncio.Task] = set()
        self.answered = 0
        self.handed_off = 0
        self._thread = threading.Thread(target=self._run, name="edgesplit-front-door", daemon=True)

    def start(self) -> None:
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._set_accepting(True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and close the listening socket; connections still waiting are closed."""
        self._stopping = True
        self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        for conn in [*self._waiting]:
            conn.close()
        self._waiting.clear()
        self._selector.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()

    async def settle(self) -> None:
        """Wait (on the loop, after :meth:`stop`) for the connections handed to it to be set up;
        they
        then close with the server's. A loop closed with one still pending left a coroutine that
        failed when collected ("Event loop is closed", seen in a test run)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- the thread

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - a bug here must not stop the server accepting
                log.exception("front door: unexpected error (serving on)")

    def _turn(self) -> None:
        """One wait on the selector, and what follows from it."""
        now = time.monotonic()
        timeout = min(self._waiting.values(), default=now + 1.0) - now
        if self._partial:
            timeout = min(timeout, REPEEK_S)
        if not self._accepting:
            timeout = min(timeout, ACCEPT_PAUSE_S / 4)
        for key, _ in self._selector.select(max(0.0, timeout)):
            if key.fileobj is self._sock:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._wake_r.recv(64)
            elif key.fileobj in self._waiting:  # (not handed off by an accept just now)
                self._look(key.fileobj)  # type: ignore[arg-type]
        for conn in [*self._partial]:
            self._look(conn)
        now = time.monotonic()
        while self._waiting and next(iter(self._waiting.values())) <= now:
            self._hand_off(next(iter(self._waiting)))  # nothing whole in time: aiohttp's to judge
        with self._lock:
            room = self._in_transit < MAX_IN_TRANSIT
        self._set_accepting(room and now >= self._paused_until)

    def _set_accepting(self, on: bool) -> None:
        if on != self._accepting:
            if on:
                self._selector.register(self._sock, selectors.EVENT_READ)
            else:
                self._selector.unregister(self._sock)
            self._accepting = on

    def _accept(self) -> None:
        for _ in range(MAX_PEEKING):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:  # out of file descriptors or memory: the kernel keeps the queue
                log.debug("accept failed: %s", e)
                self._paused_until = time.monotonic() + ACCEPT_PAUSE_S
                self._set_accepting(False)
                return
            conn.setblocking(False)
            if len(self._waiting) >= MAX_PEEKING:
                self._hand_off(next(iter(self._waiting)))
            self._waiting[conn] = time.monotonic() + PEEK_WAIT_S
            self._selector.register(conn, selectors.EVENT_READ)
            self._look(conn)  # a probe's request is often in already

    def _look(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(MAX_HEAD_NBYTES + 1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # closed (or reset) before a request: nothing to answer
            self._forget(conn)
            conn.close()
            return
        kind = classify(data)
        if kind is None:
            self._hand_off(conn)
        elif kind == WAIT:
            if conn not in self._partial:
                self._selector.unregister(conn)
                self._partial.add(conn)
        else:
            self._forget(conn)
            self._answer(conn, kind, len(data))

    def _answer(self, conn: socket.socket, kind: str, request_nbytes: int) -> None:
        try:
            conn.recv(
                request_nbytes
            )  # read it: closing with unread bytes would reset the connection
            conn.send(
                health_answer(kind, self._ready())
            )  # a few hundred bytes: the socket buffer takes them
            self.answered += 1
        except OSError:
            pass
        finally:
            conn.close()

    def _forget(self, conn: socket.socket) -> None:
        self._waiting.pop(conn, None)
        if conn in self._partial:
            self._partial.discard(conn)
        else:
            self._selector.unregister(conn)

    def _hand_off(self, conn: socket.socket) -> None:
        self._forget(conn)
        with self._lock:
            self._in_transit += 1
        self.handed_off += (
            1  # before the loop can answer the client: a count it reads then is whole
        )
        try:
            self._loop.call_soon_threadsafe(self._adopt, conn)
        except RuntimeError:  # the loop is closed
            self.handed_off -= 1
            conn.close()

    # ---- on the event loop

    def _adopt(self, conn: socket.socket) -> None:
        with self._lock:
            self._in_transit -= 1
        if self._stopping:
            conn.close()
            return
        task = self._loop.create_task(self._connect(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as e:
            log.debug("a handed-off connection failed: %s", e)
            conn.close()
