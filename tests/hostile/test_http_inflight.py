"""Hostile HTTP clients against ``edgesplit serve``, continued (see test_http.py): bytes held in
flight,
the compute queue, JSON decoded off the event loop, a 500 that names no internals, buffer reuse, and
tokens that cannot go in a header."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from http_kit import (
    INFER,
    Answer,
    Raw,
    ask,
    binary,
    infer_json,
    port_of,
    request,
    serving,
    tiny_fixture,  # noqa: F401 - the fixtures tiny
)
from netlab import make_bundle
from onnx import TensorProto, helper, numpy_helper

from edgesplit.serve.server import MB, ServeOptions, ServerThread

pytestmark = pytest.mark.timeout(90)

# ---- defect 6: bytes in flight, the compute queue, JSON off the event loop


def sum_model(path: Path, n: int) -> Path:
    """The sum of an input of ``n`` floats: a part whose requests are big and whose answers are
    small."""
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
    spec = {
        "name": "x",
        "shape": [n],
        "datatype": "FP32",
        "parameters": {"binary_data_size": x.nbytes},
    }
    body, h = binary([spec], x.tobytes(), ("y",))
    return {
        "bundle": bundle,
        "request": request("POST", "/v2/models/p0/infer", body, h),
        "sum": x.sum(),
    }


def released(srv: ServerThread, timeout_s: float = 10.0) -> bool:
    """Every body's bytes are given back (the last answer can reach us just before its handler
    ends)."""
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
    Retry-After before its body is read (the old server buffered them all: 12 x 60 MB added 605
    MB)."""
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
        big_input["bundle"],
        max_request_nbytes=2 * MB,
        max_inflight_nbytes=4 * MB,
        body_timeout_s=30,
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
                assert isinstance(a, OSError) or (
                    a.status == 503 and a.headers["retry-after"] == "1"
                ), a
        for a in done:
            check_sum(a, big_input["sum"])
        stats = srv.server.stats()
        assert stats.inflight_peak_nbytes <= 4 * MB and released(srv)


def test_a_binary_header_that_cannot_fit_the_model_is_refused_before_its_tensors(tiny):
    """A 3 MB body whose JSON header declares the wrong shape: 400 after the header, the rest never
    read."""
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
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1, (
        statuses
    )  # one computing, one queued
    for a in answers:
        if a.status == 503:
            assert int(a.headers["retry-after"]) >= 1 and "compute queue is full" in a.error()
        else:
            hlen = int(a.headers["inference-header-content-length"])
            np.testing.assert_allclose(
                np.frombuffer(a.body[hlen:], np.float32).reshape(256, 512), x, rtol=1e-5
            )


def test_defect6_json_is_decoded_off_the_event_loop(tiny, monkeypatch):
    """A 1 MB JSON request (wrong shape, so refused right after decoding) is decoded on a thread:
    while
    its decoder is held, a metadata request sent after it is answered by the event loop. The old
    server
    decoded on the event loop, so every other request waited for the decode and the refusal.

    The decoder is held on an event rather than timed: json.loads keeps the GIL, so with a merely
    big
    body the order of the two answers was a race (CI once saw the refusal first)."""
    from edgesplit.runtime import oip

    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = oip.decode_request

    def held_decode(body, header_nbytes):
        entered.set()
        release.wait(20)  # the loop, if it ran this, would stall here and answer nothing
        finished.set()
        return real(body, header_nbytes)

    monkeypatch.setattr(oip, "decode_request", held_decode)
    n = 125_000
    text = b'{"inputs":[{"name":"%s","shape":[%d],"datatype":"FP32","data":[%s]}]}' % (
        tiny["cut"].encode(),
        n,
        b",".join([b"0.123456"] * n),
    )
    with serving(tiny["bundle"], max_request_nbytes=32 * MB, max_inflight_nbytes=512 * MB) as srv:
        port = port_of(srv)
        big, probe = Raw(port, timeout_s=30), Raw(port, timeout_s=30)
        big.send(request("POST", INFER, text))
        assert entered.wait(20), "the request was never decoded"
        # /v2 is the loop's to answer (the front door answers only health probes on new connections)
        probe.send(request("GET", "/v2"))
        meta = probe.answer()
        while_held = not finished.is_set()
        release.set()
        assert (meta.status, while_held) == (200, True)
        assert big.answer().status == 400
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
    from edgesplit.serve.guard import ByteBudget
    from edgesplit.serve.transfer import BufferPool

    budget = ByteBudget(8 * MB)
    pool = BufferPool(budget)
    a = pool.take(3 * MB)
    a[:] = b"\x01" * (3 * MB)
    pool.give(a)
    b = pool.take(3 * MB - 10)  # fits the buffer just given back: the same memory, no new pages
    assert b.obj is a.obj and len(b) == 3 * MB - 10
    pool.give(b)
    assert budget.take(6 * MB)  # bodies in flight now hold 6 of the 8 MB ...
    c = pool.take(
        5 * MB
    )  # ... so the 3 MB kept buffer is dropped rather than kept beside a new one
    assert c.obj is not a.obj and pool._free_nbytes == 0


@pytest.mark.parametrize("token", ["a\r\nX-Injected: 1", "caf\u00e9", " "])
def test_serve_refuses_a_token_that_cannot_go_in_a_header(tiny, token):
    from edgesplit.errors import InputError

    with pytest.raises(InputError, match="--token holds"):
        ServeOptions(token=token).check()
