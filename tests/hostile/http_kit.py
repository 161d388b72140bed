"""What the hostile HTTP tests share (test_http.py, test_http_inflight.py): the server's low limits,
the
module's tiny bundle and server (fixtures, imported by their function names), and raw HTTP on a
socket.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from netlab import make_bundle, single_tensor_cuts

from edgesplit.serve.server import MB, ServeOptions, ServerThread

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


@pytest.fixture(scope="module", name="tiny")
def tiny_fixture(tmp_path_factory) -> dict:
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


@pytest.fixture(scope="module", name="server")
def server_fixture(tiny):
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
    """One TCP connection to the server: send exact bytes, read one answer, or see the server
    close."""

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
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
        }
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
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    length: bool = True,
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


INFER = "/v2/models/p1/infer"
