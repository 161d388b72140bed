"""``edgesplit serve``: the official tritonclient against it, malformed requests, shutdown, load."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from netlab import (
    free_port,
    make_bundle,
    serve_command,
    single_tensor_cuts,
    stop_process,
    wait_read_whole,
    wait_ready,
)

from edgesplit.runtime import oip
from edgesplit.runtime.client import OipClient
from edgesplit.serve.server import ServeOptions, ServerThread

tritonclient_http = pytest.importorskip("tritonclient.http")

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """tiny_dag cut in the middle; p1 (the second half) is the server part."""
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("tiny")
    model = zoo.save("tiny_dag", d / "tiny_dag.onnx")
    cut = single_tensor_cuts(onnx.load(model))
    cut = cut[len(cut) // 2]
    bundle = make_bundle(model, d / "bundle", [cut], [False, True])
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    mid = ort.InferenceSession(str(bundle / "parts/p0.onnx")).run(None, {"input": x})[0]
    y = ort.InferenceSession(str(bundle / "parts/p1.onnx")).run(None, {cut: mid})[0]
    return {"bundle": bundle, "cut": cut, "mid": mid, "y": y}


@pytest.fixture(scope="module")
def server(tiny):
    with ServerThread(
        tiny["bundle"], ServeOptions(port=0, token=TOKEN, max_request_nbytes=1 << 20)
    ) as s:
        yield s


def auth() -> dict[str, str]:
    return {
        "Authorization": f"Bearer {TOKEN}"
    }  # fresh each call: tritonclient adds to the dict it is given


def fresh_health(server, path: str = "/v2/health/ready") -> tuple[int, bytes]:
    """``GET path`` on a new connection, without a token (health stays open); the status and
    body."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = b""
        while data := s.recv(4096):
            got += data
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_health_on_a_new_connection_is_answered_while_the_event_loop_is_blocked(server):
    """The front door answers a probe on a new connection without the event loop: with the loop held
    for a second by a callback that spins (holding the GIL but for switches), the answer comes back
    before the callback ends. Before the front door, the probe waited for the loop."""
    started, ended = threading.Event(), []

    def block() -> None:
        started.set()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        ended.append(time.monotonic())

    before = server.server.stats().health_fast_answers
    server.loop.call_soon_threadsafe(block)
    assert started.wait(30)
    status, body = fresh_health(server)
    answered = time.monotonic()
    deadline = time.monotonic() + 30
    while not ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (status, json.loads(body)) == (200, {"ready": True})
    assert answered < ended[0]
    assert server.server.stats().health_fast_answers == before + 1
    assert fresh_health(server, "/v2/health/live") == (200, b'{"live": true}')  # no token needed


def triton_infer(server, tiny, binary: bool = True, **kw):
    client = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
    inp = tritonclient_http.InferInput(tiny["cut"], list(tiny["mid"].shape), "FP32")
    inp.set_data_from_numpy(tiny["mid"], binary_data=binary)
    out = tritonclient_http.InferRequestedOutput("logits", binary_data=binary)
    return client.infer("p1", [inp], outputs=[out], headers=auth(), **kw).as_numpy("logits")


def test_health_and_metadata(server, tiny):
    client = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("p1", headers=auth())
    meta = client.get_model_metadata("p1", headers=auth())
    assert meta["name"] == "p1" and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": tiny["cut"], "datatype": "FP32", "shape": list(tiny["mid"].shape)}
    ]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [1, 10]}]
    assert client.get_server_metadata(headers=auth())["extensions"] == ["binary_tensor_data"]
    assert "p0" not in server.server.models  # only the server parts are served


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_outputs_equal_local(server, tiny, binary):
    np.testing.assert_allclose(triton_infer(server, tiny, binary), tiny["y"], rtol=1e-6, atol=1e-6)


def test_tritonclient_all_outputs_and_gzip(server, tiny):
    client = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
    inp = tritonclient_http.InferInput(tiny["cut"], list(tiny["mid"].shape), "FP32")
    inp.set_data_from_numpy(tiny["mid"])
    got = client.infer("p1", [inp], headers=auth(), request_compression_algorithm="gzip").as_numpy(
        "logits"
    )
    np.testing.assert_allclose(got, tiny["y"], rtol=1e-6, atol=1e-6)


def raw(
    server, method: str, path: str, body: bytes = b"", headers: dict | None = None
) -> tuple[int | None, dict]:
    u = server.url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(u[0], int(u[1]), timeout=10)
    try:
        try:
            c.request(
                method,
                path,
                body=body,
                headers=headers or {},
                encode_chunked="Transfer-Encoding" in (headers or {}),
            )
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the body was sent: the answer may still be there to read
        try:
            r = c.getresponse()
            data = r.read()
        except ConnectionError:
            # a refusal of a large body closes without reading it (runtime/transfer.send_and_close):
            # a client still sending may see the reset rather than the answer
            return None, {}
    finally:
        c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, {"raw": data[:200]}


def binary_request(
    name: str, arr: np.ndarray, datatype: str = "FP32", size: int | None = None, extra: bytes = b""
) -> tuple[bytes, dict]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(arr.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": arr.nbytes if size is None else size},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + arr.tobytes() + extra, {
        "Inference-Header-Content-Length": str(len(head)),
        **auth(),
    }


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server, tiny):
    cut, mid = tiny["cut"], tiny["mid"]
    infer = "/v2/models/p1/infer"
    good, good_h = binary_request(cut, mid)
    cases = {
        "bad json": (infer, b'{"inputs": [', auth(), 400, "not valid JSON"),
        "wrong datatype": (
            infer,
            *binary_request(cut, mid.astype(np.float64), "FP64"),
            400,
            "datatype FP64",
        ),
        "binary size != header": (
            infer,
            *binary_request(cut, mid, size=mid.nbytes - 4),
            400,
            "binary_data_size",
        ),
        "body longer than tensors": (infer, *binary_request(cut, mid, extra=b"xx"), 400, "beyond"),
        "header length past body": (
            infer,
            good,
            {**good_h, "Inference-Header-Content-Length": "999999999"},
            400,
            "outside the body",
        ),
        "wrong shape": (infer, *binary_request(cut, mid.reshape(-1)[:100].copy()), 400, "shape"),
        "unknown input": (infer, *binary_request("nope", mid), 400, "unknown nope"),
        "json data of wrong length": (
            infer,
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": cut,
                            "shape": list(mid.shape),
                            "datatype": "FP32",
                            "data": [1.0, 2.0],
                        }
                    ]
                }
            ).encode(),
            auth(),
            400,
            "holds 2 values",
        ),
        "oversized body": (infer, b"{" + b" " * (2 << 20) + b"}", auth(), 413, "limit"),
        "missing token": (
            infer,
            good,
            {"Inference-Header-Content-Length": good_h["Inference-Header-Content-Length"]},
            401,
            "token",
        ),
        "wrong token": (infer, good, {**good_h, "Authorization": "Bearer wrong"}, 401, "token"),
        "unknown model": ("/v2/models/p0/infer", good, good_h, 404, "no model 'p0'"),
        "bad gzip": (infer, b"not gzip", {**auth(), "Content-Encoding": "gzip"}, 400, "gzip"),
        "unknown encoding": (
            infer,
            good,
            {**good_h, "Content-Encoding": "br"},
            415,
            "Content-Encoding",
        ),
    }
    for what, (path, body, headers, status, message) in cases.items():
        got_status, got = raw(server, "POST", path, body, headers)
        if got_status is not None or status != 413:  # None: reset under the client, as documented
            assert got_status == status, (what, got)
            assert message in got.get("error", ""), (what, got)
        np.testing.assert_allclose(triton_infer(server, tiny), tiny["y"], rtol=1e-6, atol=1e-6)
    status, got = raw(server, "GET", infer, headers=auth())
    assert status == 405 and got["error"]
    status, got = raw(
        server, "POST", "/v2/models/a%0D%0Ab/infer", good, good_h
    )  # no header injection
    assert status == 404 and "no model" in got["error"]
    status, got = raw(
        server,
        "POST",
        infer,
        iter([b"{" + b" " * (1 << 20), b" " * (1 << 20) + b"}"]),
        {**auth(), "Transfer-Encoding": "chunked"},
    )  # no Content-Length to check first
    assert status == 413 and got["error"], got
    status, got = raw(server, "POST", infer, good, good_h)
    assert status == 200


def start_server(bundle: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        serve_command(bundle, "127.0.0.1", port, *extra), stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc, url


@pytest.fixture(scope="module")
def heavy_bundle(tmp_path_factory) -> Path:
    """resnet18 whole on the server: slow enough (tens of ms) for requests to be in flight."""
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("heavy")
    model = zoo.save("resnet18", d / "resnet18.onnx")
    cut = single_tensor_cuts(onnx.load(model))[0]
    return make_bundle(model, d / "bundle", [cut], [False, True])


@pytest.mark.slow
def test_sigterm_finishes_requests_in_flight(heavy_bundle):
    """Four requests the server has read whole, queued on one compute thread, all get answers."""
    proc, url = start_server(heavy_bundle, "--threads", "1")
    try:
        spec = json.loads((heavy_bundle / "manifest.json").read_text())["parts"][1]["inputs"][0]
        x = np.ones(spec["shape"], np.float32)
        OipClient(url, timeout_s=60).infer("p1", {spec["name"]: x})  # warm up
        port = int(url.rsplit(":", 1)[1])
        chunks, header_nbytes = oip.encode_request({spec["name"]: x})
        conns = []
        for _ in range(4):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.putrequest("POST", "/v2/models/p1/infer")
            c.putheader("Content-Length", str(sum(len(b) for b in chunks)))
            c.putheader(oip.HEADER_LENGTH, str(header_nbytes))
            c.endheaders()
            for b in chunks:
                c.send(b)
            conns.append(c)
        # the readiness event: the server has read every byte of the four requests
        wait_read_whole(port, [c.sock.getsockname()[1] for c in conns])
        proc.terminate()
        results = []
        for c in conns:
            r = c.getresponse()
            body = r.read()
            assert r.status == 200, body[:200]
            out = oip.decode_response(
                body, oip.parse_header_length(r.getheader(oip.HEADER_LENGTH), len(body))
            )
            results.append(out["logits"])
            c.close()
        assert proc.wait(60) == 0
        assert all(r.shape == (1, 1000) for r in results) and len(results) == 4
    finally:
        stop_process(proc)


def test_serve_cli_errors(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "edgesplit", "serve", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "not a bundle" in r.stderr


@pytest.mark.slow
def test_light_load_no_errors_and_flat_memory(tiny):
    """A lighter version of benchmarks/server_load.py: 16 clients x 60 requests."""
    import psutil

    proc, url = start_server(tiny["bundle"])
    try:
        rss = psutil.Process(proc.pid)
        errors: list[Exception] = []

        def client(n: int) -> None:
            c = OipClient(url, timeout_s=30)
            for _ in range(n):
                try:
                    out, _ = c.infer("p1", {tiny["cut"]: tiny["mid"]})
                    np.testing.assert_allclose(out["logits"], tiny["y"], rtol=1e-6, atol=1e-6)
                except Exception as e:  # noqa: BLE001 - counted
                    errors.append(e)
            c.close()

        def round_(n: int) -> None:
            threads = [threading.Thread(target=client, args=(n,)) for _ in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)

        round_(20)  # warm up: arenas and buffers reach their working size
        before = rss.memory_info().rss
        round_(60)
        after = rss.memory_info().rss
        assert not errors, errors[:3]
        assert after <= before * 1.10, f"RSS grew {before / 2**20:.1f} -> {after / 2**20:.1f} MiB"
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_listening_line(tiny):
    port = free_port()
    proc = subprocess.Popen(
        serve_command(tiny["bundle"], "127.0.0.1", port, "--token", "t"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        assert re.search(
            rf"listening on http://127\.0\.0\.1:{port} \(1 model\(s\): p1; bearer token", line
        ), line
    finally:
        stop_process(proc)
