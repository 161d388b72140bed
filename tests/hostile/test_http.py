"""Hostile HTTP clients against ``edgesplit serve``: every case gets a 4xx or 503 with a JSON error
body
(or its connection closed, where there is no request to answer), under a deadline, and the server
keeps
serving correct outputs afterwards.

The server runs in this process (:class:`ServerThread`) with low limits so that each case is quick:
1 MB per body, 4 MB in flight, headers within 1 s of their first byte, bodies within 1 s, idle
connections closed after 1.5 s. Requests are written byte by byte on raw sockets, so the framing is
exactly what a hostile client would send.
"""

from __future__ import annotations

import gzip
import resource
import socket
import subprocess
import threading
import time

import pytest
from http_kit import (  # noqa: F401 - the fixtures tiny, server
    INFER,
    Raw,
    ask,
    assert_serves,
    binary,
    good_request,
    infer_binary,
    infer_json,
    port_of,
    request,
    server_fixture,
    serving,
    tensor,
    tiny_fixture,
)
from netlab import free_port, serve_command, stop_process, wait_ready

from edgesplit.serve.server import MB

pytestmark = pytest.mark.timeout(90)

# ---- malformed requests: (what to send) -> (status, words of the JSON error)


def cases(tiny) -> dict[str, tuple[bytes, int, str]]:
    mid, cut = tiny["mid"], tiny["cut"]
    raw = mid.tobytes()
    size = {"parameters": {"binary_data_size": mid.nbytes}}

    def shaped(shape: object, datatype: str = "FP32", data: object = None) -> bytes:
        t = {"name": cut, "shape": shape, "datatype": datatype}
        if data is None:
            body, h = binary([{**t, "parameters": {"binary_data_size": 0}}], b"")
            return request("POST", INFER, body, h)
        return request("POST", INFER, infer_json([{**t, "data": data}]))

    deep = "[" * 500 + "1.0" + "]" * 500
    return {
        "json nesting bomb": (request("POST", INFER, b"[" * 200_000), 400, "nested too deeply"),
        "data nested 500 deep": (
            request(
                "POST",
                INFER,
                b'{"inputs":[{"name":"%s","shape":[1],"datatype":"FP32","data":%s}]}'
                % (cut.encode(), deep.encode()),
            ),
            400,
            "'data' is not a list of float32",
        ),
        "not UTF-8 JSON": (
            request("POST", INFER, b'{"inputs": "\xff\xfe"}'),
            400,
            "not valid JSON",
        ),
        "JSON not an object": (request("POST", INFER, b"[1, 2]"), 400, "JSON object"),
        "zero-size shape with huge dims": (shaped([2**40, 2**40, 0]), 400, "too large"),
        "zero-size shape": (shaped([1, 16, 0, 32]), 400, "expected [1, 16, 32, 32]"),
        "negative shape": (shaped([1, -16, 32, 32], data=[]), 400, "non-negative integers"),
        "huge shape": (shaped([2**62], data=[]), 400, "too large"),
        "70 dimensions": (shaped([1] * 70, data=[1.0]), 400, "dimensions"),
        "fractional dimension": (shaped([1.5], data=[1.0]), 400, "non-negative integers"),
        "boolean dimension": (shaped([True], data=[1.0]), 400, "non-negative integers"),
        "shape not a list": (shaped("1,16,32,32", data=[]), 400, "non-negative integers"),
        "wrong dtype, size of FP32": (
            infer_binary([{**tensor(tiny, datatype="FP64"), **size}], raw),
            400,
            "binary_data_size",
        ),
        "wrong dtype, right size": (
            infer_binary([{**tensor(tiny, datatype="INT32"), **size}], raw),
            400,
            "datatype INT32, expected FP32",
        ),
        "BYTES datatype": (shaped([1], "BYTES", data=["a"]), 400, "unsupported datatype"),
        "binary size too small": (
            infer_binary([{**tensor(tiny), "parameters": {"binary_data_size": 4}}], raw[:4]),
            400,
            "does not match shape",
        ),
        "binary data past the body": (
            infer_binary([{**tensor(tiny), **size}], raw[:100]),
            400,
            "past the end",
        ),
        "bytes after the tensors": (
            infer_binary([{**tensor(tiny), **size}], raw + b"xx"),
            400,
            "beyond",
        ),
        "header length not a number": (
            request("POST", INFER, b"{}", {"Inference-Header-Content-Length": "1e3"}),
            400,
            "not an integer",
        ),
        "header length negative": (
            request("POST", INFER, b"{}", {"Inference-Header-Content-Length": "-5"}),
            400,
            "outside the body",
        ),
        "header length past the body": (
            request("POST", INFER, b"{}", {"Inference-Header-Content-Length": "99999999999"}),
            400,
            "outside the body",
        ),
        "same input twice": (
            infer_binary([{**tensor(tiny), **size}] * 2, raw * 2),
            400,
            "appears twice",
        ),
        "missing input": (request("POST", INFER, infer_json([])), 400, "missing"),
        "unknown output": (
            infer_binary([{**tensor(tiny), **size}], raw, ("nope",)),
            400,
            "has no output nope",
        ),
        "unknown model": (request("POST", "/v2/models/p0/infer", b"{}"), 404, "no model 'p0'"),
        "unknown version": (
            request("POST", "/v2/models/p1/versions/7/infer", b"{}"),
            404,
            "version 7",
        ),
        "unknown path": (request("GET", "/v2/nothing/here"), 404, "Not Found"),
        "wrong method": (request("GET", INFER), 405, "Method Not Allowed"),
        "wrong token": (
            request("POST", INFER, b"{}", {"Authorization": "Bearer nope"}),
            401,
            "bearer token",
        ),
        "no token": (request("POST", INFER, b"{}", {"Authorization": ""}), 401, "bearer token"),
        "non-UTF-8 Authorization": (
            request("POST", INFER, b"{}", {"Authorization": "Bearer \xff\xfe"}),
            400,
            "not valid UTF-8",
        ),
        "CR inside Authorization": (
            request("POST", INFER, b"{}", {"Authorization": "Bearer a\rb"}),
            400,
            "bad request",
        ),
        "unsupported Content-Encoding": (
            request("POST", INFER, b"{}", {"Content-Encoding": "br"}),
            415,
            "Content-Encoding",
        ),
        "invalid gzip": (
            request("POST", INFER, b"not gzip", {"Content-Encoding": "gzip"}),
            400,
            "gzip",
        ),
        "body over the limit (Content-Length)": (
            request("POST", INFER, b"", {"Content-Length": str(2 * MB)}, length=False),
            413,
            "over the limit",
        ),
        "Content-Length not a number": (
            request("POST", INFER, b"{}", {"Content-Length": "1e3"}, length=False),
            400,
            "bad request",
        ),
        "header line of 20 KB": (
            request("GET", "/v2/health/live", headers={"X-Big": "a" * 20_000}),
            400,
            "bad request",
        ),
        "200 headers": (
            request("GET", "/v2/health/live", headers={f"X-{i}": "1" for i in range(200)}),
            400,
            "bad request",
        ),
        "garbage request line": (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", 400, "bad request"),
    }


CASE_IDS = [
    "json nesting bomb",
    "data nested 500 deep",
    "not UTF-8 JSON",
    "JSON not an object",
    "zero-size shape with huge dims",
    "zero-size shape",
    "negative shape",
    "huge shape",
    "70 dimensions",
    "fractional dimension",
    "boolean dimension",
    "shape not a list",
    "wrong dtype, size of FP32",
    "wrong dtype, right size",
    "BYTES datatype",
    "binary size too small",
    "binary data past the body",
    "bytes after the tensors",
    "header length not a number",
    "header length negative",
    "header length past the body",
    "same input twice",
    "missing input",
    "unknown output",
    "unknown model",
    "unknown version",
    "unknown path",
    "wrong method",
    "wrong token",
    "no token",
    "non-UTF-8 Authorization",
    "CR inside Authorization",
    "unsupported Content-Encoding",
    "invalid gzip",
    "body over the limit (Content-Length)",
    "Content-Length not a number",
    "header line of 20 KB",
    "200 headers",
    "garbage request line",
]


@pytest.mark.parametrize("case", CASE_IDS)
def test_malformed_request_gets_a_json_4xx_and_the_server_keeps_serving(server, tiny, case):
    data, status, words = cases(tiny)[case]
    a = ask(server, data)
    assert a.status == status, (case, a)
    assert words in a.error(), (case, a)
    assert_serves(server, tiny)


def test_chunked_body_over_the_limit_gets_413(server, tiny):
    c = Raw(port_of(server))
    c.send(request("POST", INFER, headers={"Transfer-Encoding": "chunked"}))
    chunk = b"a" * (256 << 10)
    try:
        for _ in range(5):  # 1.25 MB in chunks, over the 1 MB limit
            c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed while we were still sending
    a = c.answer()
    assert a.status == 413 and "over the limit" in a.error()
    c.close()
    assert_serves(server, tiny)


def test_gzip_bomb_is_refused_by_its_inflated_size(server, tiny):
    bomb = gzip.compress(b"0" * (8 * MB))  # 8 KB on the wire, 8 MB inflated, 1 MB allowed
    assert len(bomb) < 64 << 10
    a = ask(server, request("POST", INFER, bomb, {"Content-Encoding": "gzip"}))
    assert a.status == 413 and "over the limit" in a.error()
    assert_serves(server, tiny)


def test_pipelined_requests_are_all_answered(server, tiny):
    c = Raw(port_of(server))
    c.send(good_request(tiny) + request("GET", "/v2/health/ready") + good_request(tiny))
    assert [c.answer().status for _ in range(3)] == [200, 200, 200]
    c.close()


# ---- defect 3: timeouts and the connection cap


def test_defect3_half_sent_headers_are_answered_408_and_closed(server, tiny):
    """Slow-loris: 20 clients trickle their headers, one byte every 0.2 s. Each is closed after the
    1 s header deadline (the old server held them for aiohttp's hour-long keep-alive)."""
    conns = [Raw(port_of(server), timeout_s=10) for _ in range(20)]
    header = request("POST", INFER, b"{}")[:-4]  # never the blank line that ends the headers
    stop = threading.Event()

    def trickle(c: Raw) -> None:
        for b in header:
            if stop.is_set():
                return
            try:
                c.send(bytes([b]))
            except OSError:
                return  # closed by the server: what we wait for
            time.sleep(0.2)

    threads = [threading.Thread(target=trickle, args=(c,), daemon=True) for c in conns]
    for t in threads:
        t.start()
    try:
        for c in conns:
            a = c.answer()
            assert a.status == 408 and "not complete within 1 s" in a.error()
            assert c.closed()
    finally:
        stop.set()
        for c in conns:
            c.close()
    assert server.server.stats().header_timeouts >= 20
    assert_serves(server, tiny)


def test_defect3_idle_keepalive_connections_are_closed(server, tiny):
    c = Raw(port_of(server), timeout_s=10)
    c.send(request("GET", "/v2/health/live"))
    assert c.answer().status == 200
    assert c.closed()  # after idle_timeout_s (1.5 s), not an hour
    silent = Raw(port_of(server), timeout_s=10)  # connected, never a byte sent
    assert silent.closed()
    c.close()
    silent.close()


@pytest.mark.slow
def test_stalled_connections_are_closed_by_the_header_deadline(tiny):
    """200 connections stall: 100 never send a byte, 100 send a part of a request's headers. With a
    1 s header deadline and a 30 s idle timeout, every one is answered 408 and closed within the
    deadline and a margin (the silent ones used to stay for the idle timeout), and real requests
    are served meanwhile."""
    with serving(tiny["bundle"], header_timeout_s=1.0, idle_timeout_s=30) as srv:
        port = port_of(srv)
        crowd = [Raw(port, timeout_s=6) for _ in range(200)]
        t0 = time.monotonic()
        for c in crowd[1::2]:
            c.send(b"POST /v2/models/p1/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
        try:
            assert_serves(srv, tiny)
            for c in crowd:
                a = c.answer()
                assert a.status == 408 and "not complete within 1 s" in a.error()
                assert c.closed()
            assert time.monotonic() - t0 < 6
        finally:
            for c in crowd:
                c.close()
        assert srv.server.stats().header_timeouts >= 200


def test_slow_body_gets_408_and_is_closed(server, tiny):
    c = Raw(port_of(server), timeout_s=10)
    c.send(request("POST", INFER, b"", {"Content-Length": "100000"}, length=False) + b"{" * 100)
    a = c.answer()
    assert a.status == 408 and "body not received within 1 s" in a.error()
    assert c.closed()
    c.close()
    assert_serves(server, tiny)


def health(port: int) -> int:
    c = Raw(port, timeout_s=10)
    try:
        c.send(request("GET", "/v2/health/ready"))
        return c.answer().status
    finally:
        c.close()


def test_defect3_idle_sockets_at_the_cap_make_room_for_new_clients(tiny):
    """With a cap of 8 connections, 30 idle or half-sent sockets: health and real requests still get
    in,
    because each new connection closes the oldest one that has no request in progress."""
    with serving(tiny["bundle"], max_connections=8, header_timeout_s=30, idle_timeout_s=30) as srv:
        port = port_of(srv)
        hogs = [Raw(port) for _ in range(30)]
        for i, h in enumerate(hogs):
            if i % 2:
                h.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")  # half-sent headers
        for _ in range(5):
            assert health(port) == 200
        assert_serves(srv, tiny)
        deadline = time.monotonic() + 10
        while srv.server.stats().connections_evicted < 22 and time.monotonic() < deadline:
            time.sleep(
                0.02
            )  # the front door hands a socket that sent no whole request on after 50 ms
        stats = srv.server.stats()
        assert stats.connections <= 8 and stats.connections_evicted >= 22
        for h in hogs:
            h.close()


def test_connections_at_the_cap_all_busy_get_503_with_retry_after(tiny):
    with serving(tiny["bundle"], max_connections=4, body_timeout_s=30, header_timeout_s=30) as srv:
        port = port_of(srv)
        busy = [Raw(port) for _ in range(4)]
        for b in busy:  # each is in the middle of a request body: nothing to close
            b.send(request("POST", INFER, b"", {"Content-Length": "1000"}, length=False) + b"{")
        deadline = time.monotonic() + 10
        while srv.server.stats().connections_busy < 4 and time.monotonic() < deadline:
            time.sleep(0.02)  # until the four requests reached the application
        a = ask(srv, request("GET", "/v2"))
        assert (
            a.status == 503
            and a.headers["retry-after"] == "1"
            and "too many connections" in a.error()
        )
        assert srv.server.stats().connections_refused >= 1
        assert (
            health(port) == 200
        )  # a probe on a new connection is the front door's, even at the cap
        for b in busy:
            b.close()
        deadline = time.monotonic() + 10
        while health(port) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert_serves(srv, tiny)


@pytest.mark.slow
def test_defect3_more_idle_sockets_than_file_descriptors(tiny, tmp_path):
    """The server process may open 256 files; 300 idle sockets must not starve it: health answers,
    and the log has no "Too many open files" (the old server logged 23,000 of them)."""
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        serve_command(tiny["bundle"], "127.0.0.1", port),
        stderr=log,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)),
    )
    socks: list[socket.socket] = []
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        for _ in range(300):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for _ in range(5):
            assert health(port) == 200
    finally:
        for s in socks:
            s.close()
        stop_process(proc)
        log.close()
    text = (tmp_path / "serve.log").read_text(errors="replace")
    assert "Too many open files" not in text, text[-2000:]
