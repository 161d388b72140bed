"""Models that would keep each stage busy for ever, and the stage time limits that stop them.

Each model is a ``Loop`` that never ends (its condition stays true, its trip count is absent or
``10**15``), placed so that one stage is the first to run it:

* simplify: every input of the loop is a constant, so onnxslim folds it, running it in ONNX
  Runtime (in its child process, killed at the deadline);
* load: the loop feeds ``NonZero``, whose output shape only a run finds (the run at load);
* profile: the loop reads the model's input, and its output's shape is static: nothing runs it
  before profiling does;
* compile: the same model, planned with a predicted profile (a device that is not this machine),
  so compiling's check of the parts is the first run.

Each ends, through the CLI, within its limit and a margin, with exit code 1 and one line naming
the model, the stage and its flag; the stage's flag is what sets the limit.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, run_cli
from onnx import TensorProto, helper, numpy_helper

import edgesplit
from edgesplit import limits
from edgesplit.limits import StageTimeout

pytestmark = pytest.mark.timeout(120)

LIMIT_S = 2.0
MARGIN_S = 20.0  # the CLI's start, imports and the loading before the stage, on a loaded machine


def _body(reads: str | None) -> onnx.GraphProto:
    """A loop body that adds 1 (and ``reads``, an outer-scope tensor) to its value; the condition
    stays true."""
    add = helper.make_node("Add", ["v_in", reads or "one"], ["v_out"], name="add")
    return helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"), add],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 4]),
        ],
        [numpy_helper.from_array(np.ones((1, 4), np.float32), "one")],
    )


def _weights(trips: int | None) -> list:
    out = [
        numpy_helper.from_array(np.array(True), "go"),
        numpy_helper.from_array(np.zeros((1, 4), np.float32), "v0"),
    ]
    return out + ([numpy_helper.from_array(np.array(trips, np.int64), "M")] if trips else [])


def endless_for_simplify(d: Path) -> Path:
    """A loop of constants only, then added to the input: onnxslim folds the loop."""
    m = make_model(
        [
            helper.make_node("Loop", ["M", "go", "v0"], ["v"], body=_body(None), name="forever"),
            helper.make_node("Add", ["x", "v"], ["y"], name="use"),
        ],
        [("x", [1, 4])],
        [("y", [1, 4])],
        _weights(10**15),
    )
    return _save(m, d / "endless_simplify.onnx")


def endless_for_load(d: Path) -> Path:
    """A loop on the input feeding NonZero: the output's shape needs a run at load."""
    m = make_model(
        [
            helper.make_node("Loop", ["", "go", "x"], ["v"], body=_body("x"), name="forever"),
            helper.make_node("NonZero", ["v"], ["y"], name="where"),
        ],
        [("x", [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "n"])],
        _weights(None),
    )
    return _save(m, d / "endless_load.onnx")


def endless_for_runs(d: Path) -> Path:
    """A loop on the input with a static output shape: profiling or compiling runs it first."""
    m = make_model(
        [
            helper.make_node("Loop", ["", "go", "x"], ["v"], body=_body("x"), name="forever"),
            helper.make_node("Relu", ["v"], ["y"], name="relu"),
        ],
        [("x", [1, 4])],
        [("y", [1, 4])],
        _weights(None),
        value_info=[helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 4])],
    )
    return _save(m, d / "endless_runs.onnx")


def _save(m: onnx.ModelProto, p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, p)
    return p


def _stopped(args: list[str], model: Path, stage: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = run_cli(*args, f"--{stage}-timeout-s", str(LIMIT_S), env=_env(tmp_path))
    took = time.monotonic() - t0
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    want = f"{model}: {stage} stopped at its time limit of {LIMIT_S:g} s (--{stage}-timeout-s)"
    assert lines[0] == f"edgesplit: error: {want}", r.stderr
    assert took < LIMIT_S + MARGIN_S, took


def _env(tmp_path: Path) -> dict:
    import os

    return {**os.environ, "EDGESPLIT_CACHE": str(tmp_path / "cache")}


@pytest.mark.slow
def test_a_model_that_would_hang_simplify_stops_at_the_simplify_limit(tmp_path):
    p = endless_for_simplify(tmp_path)
    _stopped(["profile", str(p), "-q", "-o", str(tmp_path / "p.json")], p, "simplify", tmp_path)


@pytest.mark.slow
def test_a_model_that_would_hang_load_stops_at_the_load_limit(tmp_path):
    p = endless_for_load(tmp_path)
    _stopped(["profile", str(p), "-q", "-o", str(tmp_path / "p.json")], p, "load", tmp_path)


@pytest.mark.slow
def test_a_model_that_would_hang_profile_stops_at_the_profile_limit(tmp_path):
    p = endless_for_runs(tmp_path)
    _stopped(
        ["partition", str(p), "-d", "host-2core", "-q", "-o", str(tmp_path / "plan.json")],
        p,
        "profile",
        tmp_path,
    )
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.slow  # two commands
def test_a_model_that_would_hang_compile_stops_at_the_compile_limit(tmp_path):
    p = endless_for_runs(tmp_path)
    plan = tmp_path / "plan.json"
    r = run_cli(
        "partition", str(p), "-d", "raspberry-pi5", "-q", "-o", str(plan), env=_env(tmp_path)
    )
    assert r.returncode == 0, r.stderr  # predicted: nothing runs the model
    _stopped(
        ["compile", str(p), "--plan", str(plan), "-o", str(tmp_path / "bundle")],
        p,
        "compile",
        tmp_path,
    )
    assert not (tmp_path / "bundle").exists()


@pytest.mark.slow
def test_in_python_a_stage_stops_with_stage_timeout(tmp_path, monkeypatch):
    """The same limits in the Python API: ``stage_limits`` sets them for a block."""
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    p = endless_for_runs(tmp_path)
    g = edgesplit.load_model(p)
    t0 = time.monotonic()
    with limits.stage_limits(profile_s=LIMIT_S), pytest.raises(StageTimeout) as info:
        edgesplit.partition(g, "host-2core")
    assert time.monotonic() - t0 < LIMIT_S + 10
    assert info.value.stage == "profile" and str(info.value).startswith(f"{p}: profile stopped")
    assert limits.current() == limits.StageLimits()  # set back after the block
