"""Profiling: ORT per-kernel mapping, TVM per node, roofline predictions, the JSON file."""

from __future__ import annotations

import json

import onnx
import pytest
from conftest import PPOCR_SHAPES, gpu_spec, has_cuda_gpu, make_model, ppocr_model, rand, run_cli
from onnx import helper

from edgesplit.device.spec import load_device
from edgesplit.errors import ProfileError
from edgesplit.model.load import load_model, parse_input_shapes
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import load_profile


@pytest.fixture(scope="module")
def host():
    return load_device("host")


@pytest.mark.slow
def test_every_node_measured_on_ort_and_tvm(tiny_conv, host):
    g = load_model(tiny_conv)
    prof = profile_model(g, host, ProfileOptions(runs=5, warmup=2))
    ort_e = prof.entry("cpu", "ort")
    tvm_e = prof.entry("cpu", "tvm")
    assert ort_e.source == "measured" and tvm_e.source == "measured"
    for e in (ort_e, tvm_e):
        assert set(e.nodes) == {n.name for n in g.nodes}
        assert all(c.latency_ms >= 0 and c.p90_ms >= c.latency_ms for c in e.nodes.values())
        assert e.whole_model_ms > 0
    # ORT fuses Conv+Relu; the fused kernel's time is shared by both nodes, not lost
    assert ort_e.nodes["conv1"].latency_ms > 0


@pytest.mark.slow
def test_ort_measures_every_node_of_a_real_model(host):
    """ORT's fused kernels map back to every original node of PP-OCR det. (How close the sum of the
    node medians comes to the whole model is a speed figure: benchmarks/profile_accuracy.py.)"""
    path = ppocr_model("det")
    g = load_model(path, parse_input_shapes([PPOCR_SHAPES["det"]]))
    prof = profile_model(g, host, ProfileOptions(["ort"], runs=5, warmup=2))
    e = prof.entry("cpu", "ort")
    assert set(e.nodes) == {n.name for n in g.nodes}
    assert all(c.source == "measured" and c.latency_ms >= 0 for c in e.nodes.values())
    assert e.whole_model_ms > 0 and e.sum_ms > 0


@pytest.mark.slow
def test_tvm_says_why_it_cannot_run_lstm(tmp_path, host):
    seq, inp, hid = 4, 6, 5
    m = make_model(
        [
            helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=hid, name="lstm"),
            helper.make_node("Relu", ["y"], ["z"], name="relu"),
        ],
        [("x", [seq, 1, inp])],
        [("z", [seq, 1, 1, hid])],
        [("w", rand(1, 4 * hid, inp)), ("r", rand(1, 4 * hid, hid))],
    )
    p = tmp_path / "lstm.onnx"
    onnx.save(m, p)
    prof = profile_model(load_model(p), host, ProfileOptions(runs=3, warmup=1))
    tvm_e = prof.entry("cpu", "tvm")
    assert "lstm" in tvm_e.unsupported and "LSTM" in tvm_e.unsupported["lstm"]
    assert "relu" in tvm_e.nodes
    assert "cannot run" in tvm_e.note
    assert set(prof.entry("cpu", "ort").nodes) == {"lstm", "relu"}


GPU_SPEC = gpu_spec("gpu-box", header="local: true\n")


def _gpu_profile(tiny_conv, tmp_path):
    (tmp_path / "gpu.yaml").write_text(GPU_SPEC)
    graph = load_model(tiny_conv)
    prof = profile_model(
        graph, load_device(tmp_path / "gpu.yaml"), ProfileOptions(runs=5, warmup=1)
    )
    return graph, prof.entry("gpu", "tvm")


@pytest.mark.cuda
@pytest.mark.skipif(not has_cuda_gpu(), reason="needs a CUDA GPU (none on the CI machine)")
def test_a_cuda_processor_is_measured_on_its_gpu(tiny_conv, tmp_path):
    graph, e = _gpu_profile(tiny_conv, tmp_path)
    assert e.source == "measured" and not e.unsupported, e.note
    assert set(e.nodes) == {n.name for n in graph.nodes} and e.whole_model_ms is not None
    assert all(c.latency_ms > 0 for c in e.nodes.values())


@pytest.mark.slow
@pytest.mark.skipif(has_cuda_gpu(), reason="checks a machine without a CUDA GPU")
def test_a_cuda_processor_where_no_gpu_is_is_predicted(tiny_conv, tmp_path):
    _, e = _gpu_profile(tiny_conv, tmp_path)
    assert e.source == "predicted"


def test_absent_processors_are_predicted(tiny_conv, tmp_path):
    spec = tmp_path / "phone.yaml"
    spec.write_text(
        "name: phone\nkind: device\nprocessors:\n"
        "  cpu: {kind: cpu, peak_gflops: 50, mem_bandwidth_gbps: 20, active_w: 2, idle_w: 0.1,"
        " backends: [{runtime: ort}]}\n"
        "  npu: {kind: npu, peak_gflops: 2000, mem_bandwidth_gbps: 40, active_w: 1, idle_w: 0.05,"
        " ops: {only: [Conv, Relu]}, backends: [{runtime: ort, provider: QNNExecutionProvider}]}\n"
    )
    g = load_model(tiny_conv)
    prof = profile_model(g, load_device(spec))
    npu = prof.entry("npu", "ort")
    assert npu.source == "predicted" and set(npu.nodes) == {"conv1", "relu1", "conv2"}
    assert "Gemm" in npu.unsupported["fc"]
    cpu = prof.entry("cpu", "ort")
    assert all(c.source == "predicted" for c in cpu.nodes.values())
    # a bigger conv costs more under the roofline model
    assert cpu.nodes["conv2"].latency_ms > cpu.nodes["relu1"].latency_ms


def test_profile_json_round_trip_and_bad_files(tiny_conv, host, tmp_path):
    g = load_model(tiny_conv)
    prof = profile_model(g, host, ProfileOptions(["ort"], runs=3, warmup=1))
    out = tmp_path / "p.json"
    prof.save(out)
    assert load_profile(out) == prof
    data = json.loads(out.read_text())
    assert data["model_sha256"] == g.sha256 and data["energy"] == "modelled"
    assert "latency_ms" in next(iter(data["entries"][0]["nodes"].values()))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="bad.json"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(ProfileError, match="format version 99"):
        load_profile(tmp_path / "other.json")


@pytest.mark.slow
def test_cli_profile_prints_tables(tiny_conv, tmp_path):
    out = tmp_path / "tiny.json"
    r = run_cli(
        "profile",
        str(tiny_conv),
        "--device",
        "host",
        "--runs",
        "3",
        "--warmup",
        "1",
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "totals per processor" in r.stdout and "cpu/ort" in r.stdout and "cpu/tvm" in r.stdout
    assert "top 10 operators" in r.stdout
    assert load_profile(out).entry("cpu", "ort") is not None


def test_cli_bad_device_spec_exits_2(tiny_conv, tmp_path):
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        "name: broken\nkind: device\nprocessors:\n  cpu: {kind: cpu, peak_gflops: -1}\n"
    )
    out = tmp_path / "x.json"
    r = run_cli("profile", str(tiny_conv), "--device", str(spec), "-o", str(out))
    assert r.returncode == 2
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and str(spec) in line and "processors.cpu" in line
    assert not out.exists()
