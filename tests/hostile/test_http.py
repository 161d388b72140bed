"""Hostile HTTP clients against ``edgesplit serve``: every case gets a 4xx or 503 with a JSON error body
(or its connection closed, where there is no request to answer), under a deadline, and the server keeps
serving correct outputs afterwards.

The server runs in this process (:class:`ServerThread`) with low limits so that each case is quick:
1 MB per body, 4 MB in flight, headers within 1 s of their first byte, bodies within 1 s, idle
connections closed after 1.5 s. Requests are written byte by byte on raw sockets, so the framing is
exactly what a hostile client would send.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from netlab import free_port, make_bundle, serve_command, single_tensor_cuts, stop_process, wait_ready
from onnx import TensorProto, helper, numpy_helper

from edgesplit.runtime.server import MB, ServeOptions, ServerThread

pytestmark = pytest.mark.timeout(90)

TOKEN = "hostile-test-token"
AUTH = f"Bearer {TOKEN}"
LIMITS = dict(
    token=TOKEN,
    max_request_nbytes=1 * MB,
    max_inflight_nbytes=4 * MB,
    header_timeout_s=1.0,
    body_timeout_s=1.0,
    idle_timeout_s=1.5,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """tiny_dag cut in the middle; p1 (the second half, input 64 KB FP32) is the server part."""
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("hostile_http")
    model = zoo.save("tiny_dag", d / "tiny_dag.onnx")
    cuts = single_tensor_cuts(onnx.load(model))
    cut = cuts[len(cuts) // 2]
    bundle = make_bundle(model, d / "bundle", [cut], [False, True])
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    mid = ort.InferenceSession(str(bundle / "parts/p0.onnx")).run(None, {"input": x})[0]
    y = ort.InferenceSession(str(bundle / "parts/p1.onnx")).run(None, {cut: mid})[0]
    return {"bundle": bundle, "cut": cut, "mid": mid, "y": y, "dir": d}


@contextlib.contextmanager
def serving(bundle: Path, **limits) -> Iterator[ServerThread]:
    with ServerThread(bundle, ServeOptions(port=0, **{**LIMITS, **limits})) as s:
        yield s


@pytest.fixture(scope="module")
def server(tiny):
    with serving(tiny["bundle"]) as s:
        yield s


# ---- raw HTTP on a socket


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> str:
        assert self.headers.get("content-type", "").startswith("application/json"), self
        return json.loads(self.body)["error"]


class Raw:
    """One TCP connection to the server: send exact bytes, read one answer, or see the server close."""

    def __init__(self, port: int, timeout_s: float = 15.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        self.buf += data
        return bool(data)

    def answer(self) -> Answer:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"closed without an answer (got {self.buf[:200]!r})"
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        n = int(headers.get("content-length", 0))
        while len(self.buf) < n:
            assert self._fill(), "closed in the middle of an answer"
        body, self.buf = self.buf[:n], self.buf[n:]
        return Answer(int(lines[0].split()[1]), headers, body)

    def closed(self) -> bool:
        """Wait for the server to close (True); a socket timeout fails the test."""
        while self._fill():
            pass
        return True

    def close(self) -> None:
        self.sock.close()


def port_of(server: ServerThread) -> int:
    return int(server.server.port)


def request(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, length: bool = True
) -> bytes:
    h = {"Host": "x", "Authorization": AUTH, **(headers or {})}
    if length and "Transfer-Encoding" not in h:
        h.setdefault("Content-Length", str(len(body)))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode("latin-1") + body


def ask(server: ServerThread, data: bytes) -> Answer:
    c = Raw(port_of(server))
    try:
        c.send(data)
        return c.answer()
    finally:
        c.close()


def binary(
    tensors: list[dict], raw: bytes, outputs: tuple[str, ...] = ("logits",)
) -> tuple[bytes, dict[str, str]]:
    header = {
        "inputs": tensors,
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs],
    }
    head = json.dumps(header).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}


def infer_binary(tensors: list[dict], raw: bytes, outputs: tuple[str, ...] = ("logits",)) -> bytes:
    return request("POST", INFER, *binary(tensors, raw, outputs))


def good_request(tiny) -> bytes:
    mid = tiny["mid"]
    spec = {"name": tiny["cut"], "shape": list(mid.shape), "datatype": "FP32"}
    body, h = binary([{**spec, "parameters": {"binary_data_size": mid.nbytes}}], mid.tobytes())
    return request("POST", "/v2/models/p1/infer", body, h)


def assert_serves(server: ServerThread, tiny) -> None:
    """The server still answers a good request with the right output."""
    a = ask(server, good_request(tiny))
    assert a.status == 200, a
    hlen = int(a.headers["inference-header-content-length"])
    out = np.frombuffer(a.body[hlen:], np.float32).reshape(tiny["y"].shape)
    np.testing.assert_allclose(out, tiny["y"], rtol=1e-6, atol=1e-6)


def infer_json(tensors: object) -> bytes:
    return json.dumps({"inputs": tensors}).encode()


def tensor(tiny, **kw) -> dict:
    return {"name": tiny["cut"], "shape": list(tiny["mid"].shape), "datatype": "FP32", **kw}


# ---- malformed requests: (what to send) -> (status, words of the JSON error)

INFER = "/v2/models/p1/infer"


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
        "not UTF-8 JSON": (request("POST", INFER, b'{"inputs": "\xff\xfe"}'), 400, "not valid JSON"),
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
        "bytes after the tensors": (infer_binary([{**tensor(tiny), **size}], raw + b"xx"), 400, "beyond"),
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
        "same input twice": (infer_binary([{**tensor(tiny), **size}] * 2, raw * 2), 400, "appears twice"),
        "missing input": (request("POST", INFER, infer_json([])), 400, "missing"),
        "unknown output": (
            infer_binary([{**tensor(tiny), **size}], raw, ("nope",)),
            400,
            "has no output nope",
        ),
        "unknown model": (request("POST", "/v2/models/p0/infer", b"{}"), 404, "no model 'p0'"),
        "unknown version": (request("POST", "/v2/models/p1/versions/7/infer", b"{}"), 404, "version 7"),
        "unknown path": (request("GET", "/v2/nothing/here"), 404, "Not Found"),
        "wrong method": (request("GET", INFER), 405, "Method Not Allowed"),
        "wrong token": (request("POST", INFER, b"{}", {"Authorization": "Bearer nope"}), 401, "bearer token"),
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
        "invalid gzip": (request("POST", INFER, b"not gzip", {"Content-Encoding": "gzip"}), 400, "gzip"),
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
    """With a cap of 8 connections, 30 idle or half-sent sockets: health and real requests still get in,
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
        a = ask(srv, request("GET", "/v2/health/ready"))
        assert a.status == 503 and a.headers["retry-after"] == "1" and "too many connections" in a.error()
        assert srv.server.stats().connections_refused >= 1
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


# ---- defect 6: bytes in flight, the compute queue, JSON off the event loop


def sum_model(path: Path, n: int) -> Path:
    """The sum of an input of ``n`` floats: a part whose requests are big and whose answers are small."""
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1, name="sum")],
        "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def big_input(tmp_path_factory) -> dict:
    """A served part whose input is 1.5 MB, and a valid binary request for it."""
    d = tmp_path_factory.mktemp("big_input")
    n = 375_000
    bundle = make_bundle(sum_model(d / "sum.onnx", n), d / "bundle", [], [True])
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    spec = {"name": "x", "shape": [n], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    body, h = binary([spec], x.tobytes(), ("y",))
    return {"bundle": bundle, "request": request("POST", "/v2/models/p0/infer", body, h), "sum": x.sum()}


def released(srv: ServerThread, timeout_s: float = 10.0) -> bool:
    """Every body's bytes are given back (the last answer can reach us just before its handler ends)."""
    deadline = time.monotonic() + timeout_s
    while srv.server.stats().inflight_nbytes and time.monotonic() < deadline:
        time.sleep(0.01)
    return srv.server.stats().inflight_nbytes == 0


def check_sum(a: Answer, expected: float) -> None:
    assert a.status == 200, a
    hlen = int(a.headers["inference-header-content-length"])
    np.testing.assert_allclose(np.frombuffer(a.body[hlen:], np.float32), [expected], rtol=1e-4)


def test_defect6_bodies_held_in_flight_are_capped_with_503(big_input):
    """Two valid 1.5 MB requests still arriving hold 3 of the 4 MB in flight: a third gets 503 +
    Retry-After before its body is read (the old server buffered them all: 12 x 60 MB added 605 MB)."""
    req = big_input["request"]
    with serving(big_input["bundle"], max_request_nbytes=2 * MB, body_timeout_s=30) as srv:
        port = port_of(srv)
        held = [Raw(port) for _ in range(2)]
        for h in held:
            h.send(req[:100_000])
        deadline = time.monotonic() + 10
        while srv.server.stats().inflight_nbytes < 2 * 1_500_000 and time.monotonic() < deadline:
            time.sleep(0.02)
        a = ask(srv, req)
        assert a.status == 503 and a.headers["retry-after"] == "1" and "in flight" in a.error()
        for h in held:
            h.send(req[100_000:])
            check_sum(h.answer(), big_input["sum"])
            h.close()
        assert released(srv)
        check_sum(ask(srv, req), big_input["sum"])


def test_defect6_twelve_concurrent_big_bodies_stay_under_the_cap(big_input):
    with serving(
        big_input["bundle"], max_request_nbytes=2 * MB, max_inflight_nbytes=4 * MB, body_timeout_s=30
    ) as srv:
        port, answers = port_of(srv), []

        def big() -> None:
            c = Raw(port)
            try:
                c.send(big_input["request"])
                answers.append(c.answer())
            except OSError as e:  # refused and closed before the whole body was sent
                answers.append(e)
            c.close()

        threads = [threading.Thread(target=big) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(answers) == 12
        done = [a for a in answers if isinstance(a, Answer) and a.status == 200]
        assert done, answers  # some were served ...
        for a in answers:  # ... the others turned away, never buffered beyond the cap
            if a not in done:
                assert isinstance(a, OSError) or (a.status == 503 and a.headers["retry-after"] == "1"), a
        for a in done:
            check_sum(a, big_input["sum"])
        stats = srv.server.stats()
        assert stats.inflight_peak_nbytes <= 4 * MB and released(srv)


def test_a_binary_header_that_cannot_fit_the_model_is_refused_before_its_tensors(tiny):
    """A 3 MB body whose JSON header declares the wrong shape: 400 after the header, the rest never read."""
    with serving(tiny["bundle"], max_request_nbytes=4 * MB, body_timeout_s=30) as srv:
        spec = {
            "name": tiny["cut"],
            "shape": [786432],
            "datatype": "FP32",
            "parameters": {"binary_data_size": 3 * MB},
        }
        head = json.dumps({"inputs": [spec]}).encode()
        c = Raw(port_of(srv))
        c.send(
            request(
                "POST",
                INFER,
                b"",
                {
                    "Content-Length": str(len(head) + 3 * MB),
                    "Inference-Header-Content-Length": str(len(head)),
                },
                length=False,
            )
            + head
        )
        a = c.answer()
        assert a.status == 400 and "shape [786432], expected [1, 16, 32, 32]" in a.error()
        assert c.closed()  # 3 MB unread: closed rather than read and thrown away
        c.close()
        assert released(srv)


def slow_model(path: Path) -> Path:
    """x[256,512] through 40 MatMuls with one shared 512x512 weight: about 5 GFLOP, long enough
    that requests pile up behind it on one compute thread."""
    w = numpy_helper.from_array(np.eye(512, dtype=np.float32), "w")
    nodes, prev = [], "x"
    for i in range(40):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{i}"], name=f"mm{i}"))
        prev = f"m{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    g = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 512])],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_defect6_a_full_compute_queue_answers_503_with_retry_after(tmp_path):
    bundle = make_bundle(slow_model(tmp_path / "slow.onnx"), tmp_path / "bundle", [], [True])
    x = np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32)
    spec = {
        "name": "x",
        "shape": [256, 512],
        "datatype": "FP32",
        "parameters": {"binary_data_size": x.nbytes},
    }
    body, h = binary([spec], x.tobytes(), ("y",))
    with serving(bundle, compute_threads=1, intra_op_threads=1, max_queue=1) as srv:
        answers: list[Answer] = []

        def one() -> None:
            answers.append(ask(srv, request("POST", "/v2/models/p0/infer", body, h)))

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    statuses = sorted(a.status for a in answers)
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1, statuses  # one computing, one queued
    for a in answers:
        if a.status == 503:
            assert int(a.headers["retry-after"]) >= 1 and "compute queue is full" in a.error()
        else:
            hlen = int(a.headers["inference-header-content-length"])
            np.testing.assert_allclose(
                np.frombuffer(a.body[hlen:], np.float32).reshape(256, 512), x, rtol=1e-5
            )


@pytest.mark.slow
def test_defect6_json_is_decoded_off_the_event_loop(tiny):
    """A 20 MB JSON request (wrong shape, so refused right after decoding) is decoded on a thread: a
    health check sent after it is answered first. The old server decoded on the event loop, so the
    health check waited for the decode and the refusal."""
    n = 2_500_000
    text = b'{"inputs":[{"name":"%s","shape":[%d],"datatype":"FP32","data":[%s]}]}' % (
        tiny["cut"].encode(),
        n,
        b",".join([b"0.123456"] * n),
    )
    with serving(
        tiny["bundle"], max_request_nbytes=32 * MB, max_inflight_nbytes=512 * MB, body_timeout_s=60
    ) as srv:
        port = port_of(srv)
        big, probe = Raw(port, timeout_s=60), Raw(port, timeout_s=60)
        order: list[str] = []
        big.send(request("POST", INFER, text))
        deadline = time.monotonic() + 30
        while srv.server.stats().inflight_nbytes < len(text) * 16 and time.monotonic() < deadline:
            time.sleep(0.005)  # until the body is in and its decoding reserved
        probe.send(request("GET", "/v2/health/ready"))
        done = threading.Thread(target=lambda: order.append(f"big {big.answer().status}"))
        done.start()
        order.append(f"health {probe.answer().status}")
        done.join(60)
        assert order == ["health 200", "big 400"], order
        big.close()
        probe.close()


# ---- defect 10: a 500 says nothing of the internals


def gather_model(path: Path) -> Path:
    """Gather rows of a 4x2 table by an index input: an index out of range fails inside ORT."""
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["y"], name="gather")],
        "gather",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "table")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_defect10_a_500_names_an_id_and_no_internals(tmp_path, caplog):
    bundle = make_bundle(gather_model(tmp_path / "gather.onnx"), tmp_path / "bundle", [], [True])
    with serving(bundle) as srv, caplog.at_level("ERROR", logger="edgesplit.serve"):
        ok = ask(
            srv,
            request(
                "POST",
                "/v2/models/p0/infer",
                infer_json([{"name": "idx", "shape": [1], "datatype": "INT64", "data": [3]}]),
            ),
        )
        assert ok.status == 200 and json.loads(ok.body)["outputs"][0]["data"] == [6.0, 7.0]
        a = ask(
            srv,
            request(
                "POST",
                "/v2/models/p0/infer",
                infer_json([{"name": "idx", "shape": [1], "datatype": "INT64", "data": [99]}]),
            ),
        )
    assert a.status == 500
    message = a.error()
    eid = message.split("(id ")[1].split(")")[0]
    assert message == f"internal error (id {eid}); the server log has the details"
    logged = [r for r in caplog.records if eid in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback is in the log, under the id


def test_body_buffers_are_reused_and_stay_within_the_in_flight_limit():
    from edgesplit.runtime.guard import ByteBudget
    from edgesplit.runtime.transfer import BufferPool

    budget = ByteBudget(8 * MB)
    pool = BufferPool(budget)
    a = pool.take(3 * MB)
    a[:] = b"\x01" * (3 * MB)
    pool.give(a)
    b = pool.take(3 * MB - 10)  # fits the buffer just given back: the same memory, no new pages
    assert b.obj is a.obj and len(b) == 3 * MB - 10
    pool.give(b)
    assert budget.take(6 * MB)  # bodies in flight now hold 6 of the 8 MB ...
    c = pool.take(5 * MB)  # ... so the 3 MB kept buffer is dropped rather than kept beside a new one
    assert c.obj is not a.obj and pool._free_nbytes == 0


@pytest.mark.parametrize("token", ["a\r\nX-Injected: 1", "caf\u00e9", " "])
def test_serve_refuses_a_token_that_cannot_go_in_a_header(tiny, token):
    from edgesplit.errors import InputError

    with pytest.raises(InputError, match="--token holds"):
        ServeOptions(token=token).check()
