"""Shared fixtures: tiny models built in code, the real PP-OCR models from a PyPI package."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import settings
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent

# Property tests run 100 examples each; the quick subset (README) passes --hypothesis-profile=quick.
settings.register_profile("full", max_examples=100)
settings.register_profile("quick", max_examples=20)
settings.load_profile("full")


@pytest.fixture(autouse=True)
def _caller_affinity():
    """The suite's thread on the cores it had before each test: a one-part bundle on some cores
    leaves the thread that ran it pinned there (edgesplit.runtime.affinity.keep_caller_on)."""
    import os

    from edgesplit.runtime import affinity

    before = os.sched_getaffinity(0)
    yield
    if os.sched_getaffinity(0) != before:
        os.sched_setaffinity(0, before)
    affinity.CALLER.__dict__.clear()


def max_examples(n: int) -> int:
    """``n`` examples for a test that sets its own count, or the quick profile's fewer: call it in
    ``@settings(...)`` (test modules are imported after ``--hypothesis-profile`` is applied)."""
    return min(n, settings.default.max_examples)


def make_model(nodes, inputs, outputs, weights=(), opset=17, value_info=()) -> onnx.ModelProto:
    """A model from onnx.helper pieces; inputs/outputs are (name, shape) or value infos."""

    def vi(x):
        if isinstance(x, onnx.ValueInfoProto):
            return x
        name, shape = x
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    inits = [
        w if isinstance(w, onnx.TensorProto) else numpy_helper.from_array(w[1], w[0])
        for w in weights
    ]
    g = helper.make_graph(
        list(nodes),
        "g",
        [vi(i) for i in inputs],
        [vi(o) for o in outputs],
        inits,
        value_info=list(value_info),
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def rand(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.1


def conv_chain(path: Path, ch: int = 32, hw: int = 56, n: int = 4, scale: float = 1.0) -> str:
    """Conv 3x3 / Relu x ``n`` on ``1 x ch x hw x hw`` (same shape throughout), saved at
    ``path``."""
    nodes, weights, x = [], [], "x"
    for i in range(n):
        weights.append((f"w{i}", rand(ch, ch, 3, 3, seed=i) * scale))
        nodes += [
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    onnx.save(make_model(nodes, [("x", [1, ch, hw, hw])], [(x, [1, ch, hw, hw])], weights), path)
    return str(path)


@pytest.fixture
def tiny_conv(tmp_path) -> Path:
    """Conv -> Relu -> (two branches) -> Add -> GlobalAveragePool -> Flatten -> Gemm."""
    m = make_model(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
            helper.make_node("Sigmoid", ["r1"], ["s1"], name="sig"),
            helper.make_node("Add", ["c2", "s1"], ["a"], name="add"),
            helper.make_node("GlobalAveragePool", ["a"], ["p"], name="gap"),
            helper.make_node("Flatten", ["p"], ["f"], name="flat"),
            helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
        ],
        [("x", [1, 3, 16, 16])],
        [("y", [1, 10])],
        [
            ("w1", rand(8, 3, 3, 3)),
            ("b1", rand(8)),
            ("w2", rand(8, 8, 3, 3, seed=1)),
            ("wf", rand(10, 8, seed=2)),
            ("bf", rand(10, seed=3)),
        ],
    )
    p = tmp_path / "tiny.onnx"
    onnx.save(m, p)
    return p


def gpu_spec(
    name: str, kind: str = "device", target: str = "{kind: cuda}", header: str = ""
) -> str:
    """A spec (YAML) with one GPU processor whose backend is TVM on ``target``; ``header``: more
    top-level lines (``local: true``, a description)."""
    return (
        f"name: {name}\nkind: {kind}\n{header}processors:\n  gpu:\n    kind: gpu\n    peak_gflops: "
        "10000\n"
        f"    mem_bandwidth_gbps: 1000\n    active_w: 200\n    idle_w: 30\n"
        f"    backends: [{{runtime: tvm, target: {target}}}]\n"
    )


def has_cuda_gpu() -> bool:
    """Whether TVM sees a CUDA GPU. Asked at collection: without an NVIDIA device node there is
    none, and TVM is not imported (importing it took 2.3 s of every worker's collection)."""
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return False
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001
        return False


def ppocr_model(kind: str) -> Path:
    """A real PP-OCR model shipped inside the rapidocr-onnxruntime wheel (installed by setup)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime is not installed (scripts/setup.sh installs it)")
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    found = sorted(models.glob(f"*{kind}*.onnx"))
    if not found:
        pytest.skip(f"no PP-OCR {kind} model in {models}")
    return found[0]


PPOCR_SHAPES = {"det": "x=1,3,640,640", "rec": "x=1,3,48,320", "cls": "x=1,3,48,192"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the markers true: a test that starts a real sshd (its fixtures) carries ``ssh``, and
    a test that times real runs (``measures``) stays out of the quick subset (``slow``, or one of
    the markers it leaves out): it runs alone under xdist, so there it would hold every worker
    up."""
    unmarked = [
        item.nodeid
        for item in items
        if {"sshd", "remote_tmp"} & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("ssh") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that use tests/sshd.py need @pytest.mark.ssh: " + ", ".join(unmarked)
        )
    quick_measures = [
        item.nodeid
        for item in items
        if item.get_closest_marker("measures")
        and not any(item.get_closest_marker(m) for m in ("slow", "netlab", "ssh", "java"))
    ]
    if quick_measures:
        raise pytest.UsageError(
            "tests marked measures need @pytest.mark.slow too: " + ", ".join(quick_measures)
        )


# Tests marked ``measures`` run alone under pytest-xdist, together and first: tests/measuring.py.
pytest_plugins = ["measuring", "pytester"]  # pytester: tests/test_measures_alone.py runs pytest


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the real console script in a subprocess (exit codes and stderr as a user sees them)."""
    exe = Path(sys.executable).with_name("edgesplit")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "edgesplit"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )
