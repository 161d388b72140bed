"""The offload server runs each part by what the plan chose for it: a TVM library by TVM, not the
part's fp32 ONNX file by ORT on the CPU (which it silently did before)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from conftest import gpu_spec, has_cuda_gpu

from edgesplit.compile.manual import contiguous_plan
from edgesplit.model.load import load_model
from edgesplit.runtime.client import OipClient
from edgesplit.serve.server import ServeOptions, ServerThread
from edgesplit.workflows.compile import compile_bundle


def _bundle(tmp_path, target: str):
    """tiny_dag: the first half on the host's CPU in ORT, the second on the server in TVM."""
    from edgesplit.model import zoo

    spec = tmp_path / "lab.yaml"
    spec.write_text(
        gpu_spec("lab", "server", target, "description: this machine, standing for a server\n")
    )
    graph = load_model(zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx"))
    plan = contiguous_plan(graph, "host", [("cpu", "ort"), ("lab.gpu", "tvm")])
    plan = dataclasses.replace(plan, server="lab", server_path=str(spec))
    manifest = compile_bundle(graph, plan, tmp_path / "b", bands=False)
    remote = next(p for p in manifest.parts if p.remote)
    assert remote.backend == "tvm" and remote.file.endswith(".so")
    return graph, remote


def _feeds(part, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in part.inputs}


def _serve_and_call(bundle, part, x: dict[str, np.ndarray]):
    with ServerThread(bundle, ServeOptions(port=0)) as server:
        served = server.server.models[part.name]
        client = OipClient(server.url)
        try:
            got, _ = client.infer(part.name, x, [o.name for o in part.outputs])
        finally:
            client.close()
        return served, got


@pytest.mark.slow
def test_a_tvm_server_part_is_run_by_tvm(tmp_path):
    graph, part = _bundle(tmp_path, "{kind: llvm}")
    x = _feeds(part, 0)
    served, got = _serve_and_call(tmp_path / "b", part, x)
    assert served.runs_on == "tvm" and served.note == ""
    assert served.metadata["platform"] == "edgesplit_tvm"
    want = ort.InferenceSession(str(tmp_path / "b" / part.onnx_file)).run(None, x)
    out = got[part.outputs[0].name]
    assert out.shape == want[0].shape
    assert np.abs(out - want[0]).max() <= 1e-4 * max(1.0, np.abs(want[0]).max())
    assert not np.array_equal(out, want[0])  # TVM's kernels, not ORT's (whose output is exact)


@pytest.mark.skipif(has_cuda_gpu(), reason="checks a server without a CUDA driver")
def test_a_cuda_server_part_where_no_gpu_is_is_served_by_ort_and_says_why(tmp_path):
    """Built here (CUDA kernels as source), served here: TVM's CUDA runtime does not load, so the
    part's ONNX runs on the CPU, and the note says so and why (``serve`` prints it)."""
    _, part = _bundle(tmp_path, "{kind: cuda, arch: sm_90}")
    x = _feeds(part, 1)
    served, got = _serve_and_call(tmp_path / "b", part, x)
    assert served.runs_on == "ort" and served.metadata["platform"] == "onnxruntime_onnx"
    assert "its tvm artifact does not load here" in served.note and "cuda" in served.note
    assert "serving its ONNX file on the CPU with ORT" in served.note
    want = ort.InferenceSession(str(tmp_path / "b" / part.onnx_file)).run(None, x)
    np.testing.assert_array_equal(got[part.outputs[0].name], want[0])


def test_a_triton_export_says_which_parts_lose_their_artifact(tmp_path):
    """Triton has no TVM backend: the repository holds the part's ONNX file, and export-triton says
    so per part rather than let a fleet run it on ORT unannounced."""
    pytest.importorskip("tritonclient")
    from conftest import run_cli

    _bundle(tmp_path, "{kind: llvm}")
    r = run_cli("export-triton", str(tmp_path / "b"), "-o", str(tmp_path / "repo"))
    assert r.returncode == 0, r.stderr
    assert (
        "note: p1: Triton runs its ONNX file in ONNX Runtime (fp32), not its tvm artifact"
        in r.stderr
    )
    assert (tmp_path / "repo" / "p1" / "1" / "model.onnx").is_file()
