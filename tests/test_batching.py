"""Dynamic batching on the offload server: batch-free parts, batched = unbatched, errors per
request."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_builders import mlp_graph
from netlab import make_bundle, single_tensor_cuts
from onnx import TensorProto, helper, numpy_helper

from edgesplit.bundle.batching import BATCH_DIM, free_batch
from edgesplit.bundle.format import open_verified
from edgesplit.runtime.served import ServedModel
from edgesplit.serve.compute import ComputeQueue
from edgesplit.serve.guard import ByteBudget
from edgesplit.serve.server import ServeOptions, ServerThread

tritonclient_http = pytest.importorskip("tritonclient.http")


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def lookup_model(path: Path) -> Path:
    """idx int64 [1, 4] -> Gather rows of a 10x3 table -> Reshape to the constant [1, 12]."""
    table = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(10, 3), "table")
    shape = numpy_helper.from_array(np.array([1, 12], np.int64), "shape")
    nodes = [
        helper.make_node("Gather", ["table", "idx"], ["rows"], name="gather"),
        helper.make_node("Reshape", ["rows", "shape"], ["out"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 12])],
        [table, shape],
    )
    return _save(graph, path)


def mixing_model(path: Path) -> Path:
    """x [1, 4] -> Softmax over axis 0: every row of a batch would depend on the others."""
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=0, name="softmax")],
        "mixing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return _save(graph, path)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("batching")
    tiny = zoo.save("tiny_dag", d / "tiny_dag.onnx")
    cuts = single_tensor_cuts(onnx.load(tiny))
    cut = cuts[len(cuts) // 2]
    return {
        "tiny": make_bundle(tiny, d / "tiny", [cut], [False, True]),
        "cut": cut,
        "lookup": make_bundle(lookup_model(d / "lookup.onnx"), d / "lookup", [], [True]),
        "mixing": make_bundle(mixing_model(d / "mixing.onnx"), d / "mixing", [], [True]),
    }


def _part(bundle: Path, name: str = "p0"):
    verified = open_verified(bundle)
    part = next(p for p in verified.manifest.parts if p.name == name)
    return verified, part


def test_free_batch_rewrites_static_reshape_and_refuses_parts_that_mix_rows(bundles):
    verified, part = _part(bundles["lookup"])
    found = free_batch(verified.read(part.onnx_file), part.inputs, part.outputs)
    assert found.ok and found.rows == 1 and found.reason == ""
    model = onnx.load_from_string(found.onnx_bytes)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == BATCH_DIM
    shape = next(i for i in model.graph.initializer if i.name == "shape")
    assert numpy_helper.to_array(shape).tolist() == [0, 12]  # was [1, 12]
    idx = np.array([[0, 1, 2, 3], [9, 8, 7, 6], [5, 5, 5, 5]], np.int64)
    out = ort.InferenceSession(found.onnx_bytes).run(None, {"idx": idx})[0]
    assert out.shape == (3, 12) and out[1, :3].tolist() == [27.0, 28.0, 29.0]

    verified, part = _part(bundles["mixing"])
    found = free_batch(verified.read(part.onnx_file), part.inputs, part.outputs)
    assert not found.ok and "mixes the requests" in found.reason


def mlp_model(path: Path, width: int = 256, layers: int = 3) -> Path:
    return _save(mlp_graph(width, layers, bias=1.0), path)


def test_a_fully_connected_server_part_batches_and_equals_one_request_at_a_time(tmp_path):
    """The weight-bound part of benchmarks/server_batching.py (Gemm layers, matrix-vector per
    request): its batch-free form is accepted, and a batch of 32 answers each request as it would
    alone (within float tolerance: a batch runs GEMM where one request runs GEMV)."""
    bundle = make_bundle(mlp_model(tmp_path / "mlp.onnx"), tmp_path / "b", ["relu0"], [False, True])
    verified, part = _part(bundle, "p1")
    found = free_batch(verified.read(part.onnx_file), part.inputs, part.outputs)
    assert found.ok and found.rows == 1, found.reason
    served = ServedModel(part, verified, 1, max_batch=32)
    assert served.max_batch == 32
    alone = ort.InferenceSession(str(bundle / "parts" / "p1.onnx"))
    rng = np.random.default_rng(1)
    feeds = [{"relu0": rng.standard_normal((1, 256)).astype(np.float32)} for _ in range(32)]
    out = part.outputs[0].name
    batched = served.run_batch(feeds, [[out]] * 32)
    for f, (got, _ms) in zip(feeds, batched):
        assert got[out].shape == (1, 256)
        np.testing.assert_allclose(got[out], alone.run([out], f)[0], rtol=1e-4, atol=1e-5)


def test_unbatchable_part_is_served_unbatched_with_a_note(bundles):
    with ServerThread(bundles["mixing"], ServeOptions(port=0, max_batch=8)) as s:
        assert s.server.models["p0"].max_batch == 1
        assert s.server.notes == [
            "p0: served unbatched: output y mixes the requests of a batch "
            "(batched differs from one at a time)"
        ]
        x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
        y = _infer(s.url, "p0", "x", x, "y")
        assert np.array_equal(y, np.ones_like(x))  # softmax over a single row


def _infer(
    url: str, model: str, name: str, x: np.ndarray, out: str, request_id: str = ""
) -> np.ndarray:
    client = tritonclient_http.InferenceServerClient(url.removeprefix("http://"))
    datatype = "INT64" if x.dtype == np.int64 else "FP32"
    inp = tritonclient_http.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], request_id=request_id)
    if request_id:
        assert result.get_response()["id"] == request_id
    return result.as_numpy(out)


@pytest.mark.parametrize("delay_ms", [0.0, 20.0])
def test_batched_outputs_equal_unbatched_under_concurrency(bundles, delay_ms):
    """32 tritonclient threads, 96 different requests: each answer is its own request's, in
    order."""
    cut = bundles["cut"]
    local = ort.InferenceSession(str(bundles["tiny"] / "parts" / "p1.onnx"))
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 16, 32, 32)).astype(np.float32) for _ in range(96)]
    want = [local.run(None, {cut: x})[0] for x in xs]
    options = ServeOptions(port=0, max_batch=8, max_queue_delay_ms=delay_ms, compute_threads=2)
    with ServerThread(bundles["tiny"], options) as s:
        assert s.server.models["p1"].max_batch == 8 and s.server.notes == []

        def client(k: int) -> list[np.ndarray]:  # three requests in turn on one client: order kept
            return [_infer(s.url, "p1", cut, xs[i], "logits", f"r{i}") for i in range(k, 96, 32)]

        with cf.ThreadPoolExecutor(32) as pool:
            got = list(pool.map(client, range(32)))
        stats = s.server.stats().queue
    for k, answers in enumerate(got):
        for i, y in zip(range(k, 96, 32), answers):
            np.testing.assert_allclose(y, want[i], rtol=1e-5, atol=1e-6)
    assert stats.batched_jobs > 0 and stats.runs < 96  # some requests really ran together
    assert stats.computing == 0 and stats.waiting == 0


def test_a_failing_request_does_not_fail_its_batch_mates(bundles):
    """Out-of-range indices make ONNX Runtime fail: the batch is re-run request by request."""
    good = [np.array([[i % 10, 1, 2, 3]], np.int64) for i in range(12)]
    bad = np.array([[0, 1, 99, 3]], np.int64)
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    with ServerThread(
        bundles["lookup"], ServeOptions(port=0, max_batch=16, max_queue_delay_ms=50)
    ) as s:

        def call(x: np.ndarray):
            try:
                return _infer(s.url, "p0", "idx", x, "out")
            except Exception as e:  # noqa: BLE001 - the answer under test
                return e

        with cf.ThreadPoolExecutor(13) as pool:
            got = list(pool.map(call, [*good[:6], bad, *good[6:]]))
        stats = s.server.stats().queue
    err = got.pop(6)
    assert "[500]" in str(err) and "internal error" in str(err)
    for x, y in zip(good, got):
        assert isinstance(y, np.ndarray), y
        assert np.array_equal(y, table[x[0]].reshape(1, 12))
    assert stats.computing == 0


def _queue_run(
    model: ServedModel, feeds: list[dict], budget: ByteBudget, output: str = "logits"
) -> tuple[list, object]:
    """All ``feeds`` submitted at once to one worker: they wait together, so they batch."""

    async def main():
        queue = ComputeQueue(1, 64, max_batch=len(feeds), max_delay_s=5.0, budget=budget)
        queue.start()
        try:
            subs = (queue.submit(model, f, [output]) for f in feeds)
            got = await asyncio.gather(*subs, return_exceptions=True)
            return got, queue.stats()
        finally:
            await queue.close()

    return asyncio.run(main())


def test_queue_batches_waiting_jobs_and_pays_the_copy_from_the_byte_budget(bundles):
    verified, part = _part(bundles["tiny"], "p1")
    model = ServedModel(part, verified, 1, max_batch=8)
    cut = bundles["cut"]
    rng = np.random.default_rng(2)
    feeds = [{cut: rng.standard_normal((1, 16, 32, 32)).astype(np.float32)} for _ in range(8)]
    want = [model.run(f, ["logits"])[0]["logits"] for f in feeds]
    budget = ByteBudget(1 << 30)
    got, stats = _queue_run(model, feeds, budget)
    assert (stats.runs, stats.batched_jobs) == (1, 8) and budget.used_nbytes == 0
    assert budget.peak_nbytes == sum(
        f[cut].nbytes for f in feeds
    )  # the stacked copy, then given back
    for (outputs, _), y in zip(got, want):
        np.testing.assert_allclose(outputs["logits"], y, rtol=1e-5, atol=1e-6)

    got, stats = _queue_run(model, feeds, ByteBudget(0))  # no room for the copy: one at a time
    assert (stats.runs, stats.batched_jobs) == (8, 0)
    for (outputs, _), y in zip(got, want):
        np.testing.assert_allclose(outputs["logits"], y, rtol=1e-5, atol=1e-6)


def test_serve_cli_refuses_a_bad_max_batch(bundles):
    r = subprocess.run(
        [sys.executable, "-m", "edgesplit", "serve", str(bundles["tiny"]), "--max-batch", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--max-batch" in r.stderr and "Traceback" not in r.stderr


def test_queue_reruns_a_failed_batch_one_job_at_a_time(bundles):
    verified, part = _part(bundles["lookup"])
    model = ServedModel(part, verified, 1, max_batch=8)
    feeds = [{"idx": np.array([[i, 0, 1, 2]], np.int64)} for i in range(8)]
    feeds[3] = {"idx": np.array([[0, 1, 99, 3]], np.int64)}
    got, stats = _queue_run(model, feeds, ByteBudget(1 << 30), "out")
    assert isinstance(got[3], Exception) and "out of data bounds" in str(got[3])
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    for k, (f, g) in enumerate(zip(feeds, got)):
        if k != 3:
            assert np.array_equal(g[0]["out"], table[f["idx"][0]].reshape(1, 12))
    assert stats.runs == 7 and stats.batched_jobs == 0  # the batch failed; 7 of 8 alone succeeded


def test_free_batch_frees_a_reshape_target_shared_by_several_reshapes(tmp_path):
    """An attention block's query, key and value splits read one shape initializer."""
    shape = numpy_helper.from_array(np.array([1, 2, 3], np.int64), "split")
    nodes = [
        helper.make_node("Reshape", ["x", "split"], ["q"], name="q"),
        helper.make_node("Reshape", ["x", "split"], ["k"], name="k"),
        helper.make_node("Add", ["q", "k"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "heads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])],
        [shape],
    )
    bundle = make_bundle(_save(graph, tmp_path / "heads.onnx"), tmp_path / "b", [], [True])
    verified, part = _part(bundle)
    found = free_batch(verified.read(part.onnx_file), part.inputs, part.outputs)
    assert found.ok, found.reason
    model = onnx.load_from_string(found.onnx_bytes)
    assert numpy_helper.to_array(model.graph.initializer[0]).tolist() == [0, 2, 3]
