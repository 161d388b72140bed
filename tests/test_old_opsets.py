"""Old opsets: models exported for opset 6 (IR version 3) are upgraded at load, deploy, and match.

ORT runs few opset-6 kernels: not AveragePool-1 nor Gemm-6. So the AveragePool/Conv/Gemm model's
bundle is compared with onnx's reference evaluator on the original file (and ORT on the upgraded
model), and a model of ops ORT does run at opset 6 (Conv, MaxPool, MatMul, Sum) is compared with
ORT on the original file.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_cli
from model_builders import old_cnn
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import edgesplit
from edgesplit.compile.manual import contiguous_plan
from edgesplit.errors import ModelLoadError
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle

X = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)


def _bundle_output(bundle) -> np.ndarray:
    with load(bundle) as sess:
        return sess.run({"x": X})["y"]


def test_opset6_model_loads_upgraded_with_a_note(tmp_path):
    p = tmp_path / "old.onnx"
    onnx.save(old_cnn(), p)
    g = load_model(p)
    assert [n.op_type for n in g.nodes] == ["Conv", "Relu", "AveragePool", "Flatten", "Gemm"]
    assert g.inputs == ("x",)  # IR 3 listed the weights as inputs too
    assert g.notes == ("upgraded from opset 6 to 13 with onnx.version_converter",)
    assert {o.domain: o.version for o in g.model.opset_import}[""] == 13
    # a device that is not this machine: everything predicted, nothing measured
    r = run_cli("partition", str(p), "-d", "raspberry-pi5", "-o", str(tmp_path / "plan.json"), "-q")
    assert r.returncode == 0, r.stderr
    assert f"note: {p}: upgraded from opset 6 to 13" in " ".join(r.stderr.split())


@pytest.mark.slow
def test_opset6_model_ort_runs_deploys_with_the_cli_and_matches_ort_on_the_original(tmp_path):
    p = tmp_path / "old_ort.onnx"
    onnx.save(old_cnn(ort_runs_it=True), p)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})[
        0
    ]
    r = run_cli("deploy", str(p), "-d", "host", "-o", str(tmp_path / "bundle"), "--runs", "2")
    assert r.returncode == 0, r.stderr
    assert f"note: {p}: upgraded from opset 6 to 13" in " ".join(
        r.stderr.split()
    )  # deploy says it too
    np.testing.assert_allclose(_bundle_output(tmp_path / "bundle"), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_opset6_cnn_with_averagepool_deploys_and_matches_the_original(tmp_path):
    p = tmp_path / "old.onnx"
    onnx.save(old_cnn(), p)
    want = ReferenceEvaluator(str(p)).run(None, {"x": X})[0]
    upgraded = onnx.version_converter.convert_version(onnx.load(p), 13)
    via_ort = ort.InferenceSession(upgraded.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(via_ort.run(None, {"x": X})[0], want, rtol=1e-5, atol=1e-6)
    edgesplit.deploy(p, "host", tmp_path / "bundle", profiling=ProfileOptions(runs=2))
    np.testing.assert_allclose(_bundle_output(tmp_path / "bundle"), want, rtol=1e-5, atol=1e-6)
    # and split in two on the big and little cores
    g = load_model(p)
    compile_bundle(
        g,
        contiguous_plan(g, "host-biglittle", [("big", "ort"), ("little", "ort")]),
        tmp_path / "b2",
    )
    np.testing.assert_allclose(_bundle_output(tmp_path / "b2"), want, rtol=1e-5, atol=1e-6)


def _image_scaler_model(with_shape_ops: bool) -> onnx.ModelProto:
    """ImageScaler -> Conv at opset 6, as old model-zoo exports: ORT still runs ImageScaler, onnx
    dropped it, so onnx's converter cannot upgrade the model. ``with_shape_ops`` adds a Reshape
    to the output's own Shape: a shape computation, which cannot be folded without upgrading."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w"
    )
    nodes = [
        helper.make_node(
            "ImageScaler", ["x"], ["s"], scale=0.5, bias=[0.1, 0.2, 0.3], name="scaler"
        ),
        helper.make_node(
            "Conv", ["s", "w"], ["c" if with_shape_ops else "y"], kernel_shape=[3, 3], pads=[1] * 4
        ),
    ]
    if with_shape_ops:
        nodes += [
            helper.make_node("Shape", ["c"], ["sh"], name="shape"),
            helper.make_node("Reshape", ["c", "sh"], ["y"], name="reshape"),
        ]
    wi = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])
    m = helper.make_model(
        helper.make_graph(nodes, "g", [x, wi], [y], [w]), opset_imports=[helper.make_opsetid("", 6)]
    )
    m.ir_version = 3
    return m


def test_upgrade_failure_loads_without_folding_when_there_is_nothing_to_fold(tmp_path):
    p = tmp_path / "scaler.onnx"
    onnx.save(_image_scaler_model(False), p)
    g = load_model(p)
    assert g.notes == (
        "opset 6 could not be upgraded to 13 (no onnx schema for ImageScaler); loaded without "
        "folding "
        "(nothing to fold)",
    )
    assert [n.op_type for n in g.nodes] == ["ImageScaler", "Conv"] and g.tensors["s"].shape == (
        1,
        3,
        8,
        8,
    )
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    compile_bundle(
        g, contiguous_plan(g, "host-biglittle", [("big", "ort"), ("little", "ort")]), tmp_path / "b"
    )
    np.testing.assert_allclose(_bundle_output(tmp_path / "b"), want, rtol=1e-5, atol=1e-6)


def test_upgrade_failure_with_shapes_to_fold_is_named(tmp_path):
    p = tmp_path / "scaler_shapes.onnx"
    onnx.save(_image_scaler_model(True), p)
    with pytest.raises(
        ModelLoadError,
        match=r"could not be upgraded to 13 \(no onnx schema for ImageScaler\), and it",
    ):
        load_model(p)
