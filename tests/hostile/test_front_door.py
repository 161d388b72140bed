"""Hostile first bytes at the server's front door (``edgesplit/serve/frontdoor.py``), the thread
that answers health probes on new connections off the event loop and hands every other connection
to aiohttp.

Each case ends in a correct answer or a clean close, under a deadline; the front door answers only
what it should (the others reach aiohttp, with their bytes unchanged); the server keeps serving
correct outputs, and once the clients have closed, it counts no connection left open.
"""

from __future__ import annotations

import socket
import time

import pytest
from http_kit import (  # noqa: F401 - the fixtures tiny, server
    Raw,
    assert_serves,
    port_of,
    request,
    server_fixture,
    serving,
    tiny_fixture,
)

pytestmark = pytest.mark.timeout(90)

READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
RESET = b"reset"  # in a case's steps: close with a reset (SO_LINGER 0) and stop
CLOSED = "closed"


# (what to send: bytes, or a pause in seconds) -> (statuses answered, then CLOSED if the server
# closes; answered by the front door?)
CASES: dict[str, tuple[list[bytes | float], list[int | str], bool]] = {
    "a health request": ([READY], [200, CLOSED], True),
    "HTTP/1.0": ([b"GET /v2/health/live HTTP/1.0\r\n\r\n"], [200, CLOSED], True),
    "half-closed after a health request": ([READY, b"shut"], [200, CLOSED], True),
    "a part of a health request, then a stall": ([b"GET /v2/health/rea"], [408, CLOSED], False),
    "a health request whose end comes late": ([READY[:-2], 0.1, READY[-2:]], [200], False),
    "a health request with a body": (
        [READY[:-2] + b"Content-Length: 5\r\n\r\nhello"],
        [200],
        False,
    ),
    "a chunked health request": (
        [READY[:-2] + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"],
        [200],
        False,
    ),
    "two pipelined health requests": ([READY + READY], [200, 200], False),
    "a non-health request whose first byte comes alone": (
        [b"G", 0.1, request("GET", "/v2/models/p1")[1:]],
        [200],
        False,
    ),
    "a path that parts from health late": (
        [b"GET /v2/health/readyz HTTP/1.0\r\n\r\n"],
        [404],
        False,
    ),
    "a request line without a version": ([b"GET /v2/health/ready\r\n\r\n"], [400, CLOSED], False),
    "HTTP/1.1 without Host": ([b"GET /v2/health/ready HTTP/1.1\r\n\r\n"], [400, CLOSED], False),
    "two Host headers": ([READY[:-2] + b"Host: y\r\n\r\n"], [400, CLOSED], False),
    "a folded header line": ([READY[:-2] + b" y: z\r\n\r\n"], [400, CLOSED], False),
    "a malformed header line": ([READY[:-2] + b"Host x\r\n\r\n"], [400, CLOSED], False),
    "bare LF line ends": ([b"GET /v2/health/ready HTTP/1.1\nHost: x\n\n"], [400, CLOSED], False),
    "garbage bytes": ([b"\x00\xff\xfe garbage \x01\r\n\r\n"], [400, CLOSED], False),
    "headers longer than a probe's": (
        [READY[:-2] + b"X-Pad: " + b"a" * 3000 + b"\r\n\r\n"],
        [200],
        False,
    ),
    "closed before a byte": ([b"shut"], [CLOSED], False),
    "reset before a byte": ([RESET], [], False),
    "reset after a part of a health request": ([b"GET /v2/health", RESET], [], False),
}


def run_case(port: int, steps: list[bytes | float]) -> Raw | None:
    c = Raw(port, timeout_s=10)
    for step in steps:
        if isinstance(step, float):
            time.sleep(step)
        elif step == RESET:
            c.sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            c.close()
            return None
        elif step == b"shut":
            c.sock.shutdown(socket.SHUT_WR)
        else:
            c.send(step)
    return c


def wait_no_connections(srv, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while srv.server.stats().connections and time.monotonic() < deadline:
        time.sleep(0.02)
    return srv.server.stats().connections


@pytest.mark.parametrize("case", list(CASES))
def test_front_door_case_ends_in_an_answer_or_a_clean_close(server, tiny, case):
    steps, expected, fast = CASES[case]
    before = server.server.stats().health_fast_answers
    c = run_case(port_of(server), steps)
    if c is not None:
        try:
            got: list[int | str] = [c.answer().status for s in expected if s != CLOSED]
            if CLOSED in expected:
                got.append(CLOSED if c.closed() else "open")
        finally:
            c.close()
        assert got == expected, case
    assert server.server.stats().health_fast_answers - before == int(fast), case
    assert wait_no_connections(server) == 0
    assert_serves(server, tiny)


def test_a_health_probe_gets_past_a_crowd_of_silent_and_stalled_sockets(tiny):
    """100 sockets that send nothing and 100 that sent a part of a health request and stalled, at a
    cap of 64 connections: probes on new connections are answered by the front door, real
    requests get in (idle ones are closed at the cap), and the count of connections never passes
    the cap and falls to 0 once the crowd leaves."""
    with serving(tiny["bundle"], max_connections=64, header_timeout_s=30, idle_timeout_s=30) as srv:
        port = port_of(srv)
        crowd = [Raw(port) for _ in range(200)]
        for c in crowd[1::2]:
            c.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: ")
        try:
            for _ in range(5):
                probe = run_case(port, [READY])
                assert probe is not None and probe.answer().status == 200
                probe.close()
            assert (
                srv.server.stats().health_fast_answers >= 1
            )  # unless this thread lost the CPU 50 ms
            assert_serves(srv, tiny)
            assert srv.server.stats().connections <= 64
        finally:
            for c in crowd:
                c.close()
        assert wait_no_connections(srv) == 0
        assert_serves(srv, tiny)
