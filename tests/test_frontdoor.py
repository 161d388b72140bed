"""The server's front door (``edgesplit/serve/frontdoor.py``): which first bytes it answers, and a
real listening socket in front of a real event loop: health answered from the readiness flag,
everything else handed to the loop with its bytes unchanged."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from edgesplit.serve.frontdoor import (
    MAX_HEAD_NBYTES,
    MAX_PEEKING,
    WAIT,
    FrontDoor,
    classify,
    health_answer,
)

H = "GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize(
    "data, kind",
    [
        (H, "ready"),
        ("GET /v2/health/live HTTP/1.0\r\n\r\n", "live"),
        (
            "GET /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: "
            "close\r\n\r\n",
            "live",
        ),
        ("GET /v2/health/live HTTP/1.0\r\nHost: x\r\nUser-Agent: probe/1\t(x)\r\n\r\n", "live"),
        ("", WAIT),
        ("G", WAIT),
        ("GET /v2/health/rea", WAIT),
        ("GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n", WAIT),  # headers not ended
        ("GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r", WAIT),
        ("P", None),
        ("GET /v2/models/p1 HTTP/1.1\r\n\r\n", None),
        ("GET /v2/health/readyz HTTP/1.1\r\n\r\n", None),
        ("GET /v2/health/ready?x=1 HTTP/1.1\r\n\r\n", None),
        ("HEAD /v2/health/ready HTTP/1.1\r\n\r\n", None),
        ("GET /v2/health/ready HTTP/2.0\r\n\r\n", None),
        ("GET /v2/health/ready HTTP/1.1\nHost: x\n\n", None),  # bare LF: aiohttp's to judge
        (H + "x", None),  # something follows: a body or a pipelined request
        (H + H, None),
        (H.replace("\r\n\r\n", "\r\nContent-Length: 5\r\n\r\n"), None),
        (H.replace("\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n"), None),
        (H.replace("Host: x", "Host x"), None),  # a malformed header line
        (H.replace("Host: x", "Ho st: x"), None),
        (H.replace("Host: x", " Host: x"), None),  # a folded line
        (H.replace("Host: x", "X: y"), None),  # HTTP/1.1 without Host (aiohttp answers 400)
        (H.replace("Host: x", "Host: x\r\nHost: y"), None),
        (H.replace("Host: x", "Host: x\r\nContent-Length: 0\r\nContent-Length: 0"), None),
        (H.replace("Host: x", "Host: x\x00y"), None),
        (H.replace("Host: x", "Host: x\r\n" * 40), None),  # more header lines than a probe sends
        (H.replace("Host: x", "X: " + "a" * MAX_HEAD_NBYTES), None),
        ("\x00\xff\r\n\r\n", None),
    ],
)
def test_classify(data, kind):
    assert classify(data.encode("latin-1")) == kind


def test_health_answer_is_the_application_s_json():
    head, _, body = health_answer("ready", False).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in head
    assert json.loads(body) == {"ready": False} and f"Content-Length: {len(body)}".encode() in head
    assert health_answer("ready", True).startswith(b"HTTP/1.1 200 OK")
    assert health_answer("live", False).startswith(b"HTTP/1.1 200 OK")  # live while not ready


class Echo(asyncio.Protocol):
    """What the loop builds for a connection handed to it: answers ``handed <bytes it got>`` at the
    first blank line (or when the peer half-closes)."""

    def connection_made(self, transport):
        self.transport, self.data = transport, b""

    def data_received(self, data):
        self.data += data
        if b"\r\n\r\n" in self.data:
            self.transport.write(b"handed " + self.data)
            self.transport.close()


@pytest.fixture
def door() -> Iterator[tuple[FrontDoor, int, dict]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    state = {"ready": False}
    sock = socket.create_server(("127.0.0.1", 0))
    d = FrontDoor(sock, loop, Echo, lambda: state["ready"])
    d.start()
    try:
        yield d, sock.getsockname()[1], state
    finally:
        d.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def exchange(port: int, *chunks: bytes, pause_s: float = 0.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for i, c in enumerate(chunks):
            if i:
                time.sleep(pause_s)
            s.sendall(c)
        got = b""
        while data := s.recv(65536):
            got += data
        return got


def test_health_is_answered_from_the_readiness_flag(door):
    d, port, state = door
    assert exchange(port, H.encode()).startswith(
        b"HTTP/1.1 503 "
    )  # not ready yet (or shutting down)
    state["ready"] = True
    got = exchange(port, H.encode())
    assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b'{"ready": true}')
    assert exchange(port, b"GET /v2/health/live HTTP/1.0\r\n\r\n").endswith(b'{"live": true}')
    assert d.answered == 3 and d.handed_off == 0


def test_everything_else_reaches_the_loop_with_its_bytes_unchanged(door):
    d, port, _ = door
    other = b"POST /v2/models/p1/infer HTTP/1.1\r\nHost: x\r\n\r\n"
    assert exchange(port, other) == b"handed " + other
    # a health request's first bytes, then the rest after the front door stopped waiting
    assert exchange(port, b"GET /v2/health/rea", b"dy HTTP/1.1\r\n\r\n", pause_s=0.2) == (
        b"handed GET /v2/health/ready HTTP/1.1\r\n\r\n"
    )
    pipelined = (H + H).encode()
    assert exchange(port, pipelined) == b"handed " + pipelined
    assert d.answered == 0 and d.handed_off == 3


def test_silent_and_stalled_sockets_do_not_keep_health_out(door):
    """More silent sockets than the front door watches at once, and as many that sent a part of a
    health request and stalled: a probe behind them is still answered, and all are handed on."""
    d, port, state = door
    state["ready"] = True
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_PEEKING + 8)]
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_PEEKING + 8)]
    for s in stalled:
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: ")
    try:
        assert exchange(port, H.encode()).startswith(b"HTTP/1.1 200 OK")
        deadline = time.monotonic() + 10
        while d.handed_off < len(silent) + len(stalled) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert d.handed_off == len(silent) + len(stalled) and d.answered == 1
    finally:
        for s in silent + stalled:
            s.close()


def test_a_connection_closed_before_a_request_is_closed_here(door):
    d, port, _ = door
    socket.create_connection(("127.0.0.1", port)).close()
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
    s.close()
    assert exchange(port, b"GET /v2/health/live HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200")
    assert (
        d.answered == 1 and d.handed_off == 0
    )  # the two closed ones were never handed to the loop


def test_a_connection_handed_off_as_the_door_stops_is_set_up_before_the_loop_closes(monkeypatch):
    """A connection handed to the loop just before the server stops: its set-up is still pending
    when the door stops; ``settle`` waits for it, so closing the loop leaves no coroutine that fails
    when collected (without it: "Event loop is closed", reported as an unraisable exception)."""
    import gc
    import sys

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    loop = asyncio.new_event_loop()  # not running yet: the hand-off waits in its queue
    sock = socket.create_server(("127.0.0.1", 0))
    d = FrontDoor(sock, loop, Echo, lambda: True)
    d.start()
    client = socket.create_connection(sock.getsockname()[:2], timeout=10)
    client.sendall(b"POST /v2/models/p1/infer HTTP/1.1\r\nHost: x\r\n\r\n")
    deadline = time.monotonic() + 10
    while d.handed_off == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert d.handed_off == 1
    loop.run_until_complete(asyncio.sleep(0))  # the loop adopts it; its set-up starts and waits
    d.stop()
    loop.run_until_complete(d.settle())
    loop.close()
    client.close()
    del d  # it holds its tasks
    gc.collect()
    assert not unraisable, [u.exc_value for u in unraisable]
