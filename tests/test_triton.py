"""``edgesplit export-triton``: a Triton model repository whose configs Triton's own schema
accepts."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
from google.protobuf import text_format
from netlab import make_bundle, single_tensor_cuts

from edgesplit.compile.triton import export_triton, model_config_pb2
from edgesplit.errors import BundleError

pytest.importorskip("tritonclient")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("triton")
    path = zoo.save("squeezenet", d / "squeezenet.onnx")
    cuts = single_tensor_cuts(onnx.load(path))
    cuts = [cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]]
    return {
        "chain": make_bundle(path, d / "chain", cuts, [False, True, True]),
        "local": make_bundle(path, d / "local", cuts, [False, False, False]),
        "cuts": cuts,
    }


def parse(path) -> object:
    return text_format.Parse(path.read_text(), model_config_pb2().ModelConfig())


def test_export_writes_configs_triton_parses_and_an_ensemble(bundles, tmp_path):
    repo = tmp_path / "repo"
    result = export_triton(bundles["chain"], repo)
    assert result.models == ("p1", "p2") and result.ensembles == ("ensemble",)
    assert sorted(p.name for p in repo.iterdir()) == ["ensemble", "p1", "p2"]
    pb = model_config_pb2()
    a, b = bundles["cuts"]
    for name, (inp, out) in {"p1": (a, b), "p2": (b, "logits")}.items():
        cfg = parse(repo / name / "config.pbtxt")
        assert (
            cfg.name == name and cfg.platform == "onnxruntime_onnx" and cfg.backend == "onnxruntime"
        )
        assert cfg.max_batch_size == 0
        assert [i.name for i in cfg.input] == [inp] and [o.name for o in cfg.output] == [out]
        assert all(t.data_type == pb.DataType.Value("TYPE_FP32") for t in [*cfg.input, *cfg.output])
        assert list(cfg.output[0].dims)[:1] == [1] and len(cfg.input[0].dims) == 4
        assert (repo / name / "1" / "model.onnx").read_bytes() == (
            bundles["chain"] / "parts" / f"{name}.onnx"
        ).read_bytes()
    ens = parse(repo / "ensemble" / "config.pbtxt")
    assert ens.platform == "ensemble"
    assert [i.name for i in ens.input] == [a] and [o.name for o in ens.output] == ["logits"]
    steps = ens.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["p1", "p2"]
    assert dict(steps[0].output_map) == {b: b} and dict(steps[1].input_map) == {b: b}
    assert (repo / "ensemble" / "1").is_dir()


def test_export_replaces_a_repository_and_refuses_bundles_without_server_parts(bundles, tmp_path):
    repo = tmp_path / "repo"
    (repo / "stale").mkdir(parents=True)
    export_triton(bundles["chain"], repo)
    assert not (repo / "stale").exists()
    with pytest.raises(BundleError, match="no server parts"):
        export_triton(bundles["local"], tmp_path / "other")
    assert not (tmp_path / "other").exists()
    result = export_triton(bundles["local"], tmp_path / "all", all_parts=True)
    assert result.models == ("p0", "p1", "p2") and result.ensembles == ("ensemble",)


def test_export_triton_cli(bundles, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "edgesplit", "export-triton", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = cli(str(bundles["chain"]), "-o", str(tmp_path / "repo"))
    assert r.returncode == 0, r.stderr
    assert "2 model(s) (p1, p2), ensemble(s) ensemble" in r.stdout
    r = cli(str(bundles["local"]), "-o", str(tmp_path / "repo2"))
    assert r.returncode == 2 and "no server parts" in r.stderr


def test_export_with_dynamic_batching(bundles, tmp_path):
    """--max-batch: batch-free parts, dims without the batch, dynamic_batching, a batching
    ensemble."""
    import numpy as np
    import onnxruntime as ort

    repo = tmp_path / "repo"
    result = export_triton(bundles["chain"], repo, max_batch=4, max_queue_delay_ms=0.5)
    assert result.unbatched == ()
    a, b = bundles["cuts"]
    for name, inp in {"p1": a, "p2": b}.items():
        cfg = parse(repo / name / "config.pbtxt")
        assert cfg.input[0].name == inp
        assert cfg.max_batch_size == 4 and cfg.HasField("dynamic_batching")
        assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
        model = onnx.load(repo / name / "1" / "model.onnx")
        first = model.graph.input[0].type.tensor_type.shape.dim
        assert first[0].dim_param == "batch"
        assert list(cfg.input[0].dims) == [d.dim_value for d in first[1:]]  # no batch in dims
    ens = parse(repo / "ensemble" / "config.pbtxt")
    assert ens.max_batch_size == 4 and len(ens.input[0].dims) == 3
    # the exported p1 runs three requests at once as the bundle's p1 runs each of them
    src = ort.InferenceSession(str(bundles["chain"] / "parts" / "p1.onnx"))
    shape = src.get_inputs()[0].shape
    xs = np.random.default_rng(0).standard_normal((3, *shape[1:])).astype(np.float32)
    got = ort.InferenceSession(str(repo / "p1" / "1" / "model.onnx")).run(None, {a: xs})[0]
    want = np.concatenate([src.run(None, {a: xs[i : i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_export_batching_leaves_parts_that_mix_rows_unbatched(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=0)],
        "mixing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    bundle = make_bundle(tmp_path / "m.onnx", tmp_path / "b", [], [True])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesplit",
            "export-triton",
            str(bundle),
            "-o",
            str(tmp_path / "repo"),
            "--max-batch",
            "8",
            "--max-queue-delay-ms",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "note: p0: not batched: output y mixes the requests of a batch" in r.stderr
    cfg = parse(tmp_path / "repo" / "p0" / "config.pbtxt")
    assert (
        cfg.max_batch_size == 0
        and not cfg.HasField("dynamic_batching")
        and list(cfg.input[0].dims) == [1, 4]
    )
