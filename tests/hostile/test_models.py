"""Hostile models: each case is built in code (tests/hostile/model_corpus.py), states its outcome,
and runs under a deadline.

Outcomes are either ``refused`` (``edgesplit partition`` exits 2 with one line on stderr that
names the file and the problem, and writes nothing) or ``loads`` (``load_model`` returns a graph,
with what the case checks). The CLI runs in-process here, through the same ``main`` as the
console script, so the corpus stays fast; the defect tests drive the real console script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, rand, run_cli
from model_corpus import (
    CASES,
    external_data_model,
    external_over_limit,
    huge_input,
    matmul_mismatch,
    opset_999,
    string_input,
    value_dependent,
    zero_size_dim,
)

from edgesplit.errors import ModelLoadError
from edgesplit.model.load import load_model

pytestmark = pytest.mark.timeout(120)


def _case_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    return d


@pytest.fixture(autouse=True)
def _short_shape_run(monkeypatch):
    """The run that finds data-dependent shapes stops after 2 s here (60 s by default)."""
    from edgesplit.model import shapes

    monkeypatch.setattr(shapes, "PROBE_TIMEOUT_S", 2.0)


@pytest.mark.parametrize("label", list(CASES))
def test_hostile_model(label, tmp_path, capfd, monkeypatch):
    from edgesplit.model import shapes

    case = CASES[label]
    monkeypatch.setattr(shapes, "PROBE_TIMEOUT_S", case.probe_timeout_s)
    path = case.build(_case_dir(tmp_path))
    if case.outcome == "loads":
        g = load_model(path)
        assert case.check is None or case.check(g), label
        return
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    msg = str(info.value)
    assert str(path) in msg and case.expect in msg and "\n" not in msg, msg
    _assert_cli_refuses(path, case.expect, tmp_path, capfd)


def _assert_cli_refuses(path: Path, expect: str, tmp_path: Path, capfd) -> None:
    from edgesplit.cli.main import main

    out = tmp_path / "plan.json"
    capfd.readouterr()
    with pytest.raises(SystemExit) as code:
        main(["partition", str(path), "-o", str(out)])
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert code.value.code == 2, err
    assert len(lines) == 1 and str(path) in lines[0], err
    assert expect in lines[0] or path.is_dir(), err  # click names a directory in its own words
    assert "Traceback" not in err
    assert not out.exists() and not out.with_suffix(".profile.json").exists()


def test_corpus_has_at_least_25_cases_of_each_kind():
    assert len(CASES) >= 25
    assert {c.outcome for c in CASES.values()} == {"refused", "loads"}


# ---- the defects of issue 12 that are about models, each with its own test


def _cli_with_memory_cap(args: list[str], cap_bytes: int) -> subprocess.CompletedProcess:
    """The CLI's ``main`` in a process whose address space is capped, so a model that would make
    it read gigabytes fails fast instead of filling this machine's memory."""
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({cap_bytes}, {cap_bytes}))\n"
        "from edgesplit.cli.main import main\n"
        "main(sys.argv[1:])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=_env(),
    )


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _one_line(r: subprocess.CompletedProcess, path: Path, *texts: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert all(t in lines[0] for t in texts), r.stderr
    return lines[0]


def test_defect5_external_data_counts_against_the_limit(tmp_path):
    d = _case_dir(tmp_path)
    (d / "w.bin").write_bytes(b"\0" * 20_000)
    p = external_data_model(d, "small_file_big_weights", "w.bin", length=20_000)
    assert p.stat().st_size < 1_000  # the file alone is far under the limit
    with pytest.raises(
        ModelLoadError,
        match=r"MB of external data \(w.bin\) .* over the model size limit of 0.01 MB",
    ):
        load_model(p, max_model_mb=0.01)
    # 1.5 GB of (sparse) external weights behind a tiny model.onnx: refused before any is read
    p = external_over_limit(d)
    r = _cli_with_memory_cap(["partition", str(p), "-o", str(tmp_path / "plan.json")], 3 << 30)
    _one_line(r, p, "1500.0 MB of external data (big.bin)", "over the model size limit of 1024 MB")


@pytest.mark.slow
def test_defect9_opset_999_and_mismatched_matmul_are_refused_by_partition(tmp_path):
    d = _case_dir(tmp_path)
    for path, texts in [
        (opset_999(d), ["opset 999 of domain 'ai.onnx'"]),
        (matmul_mismatch(d), ["MatMul", "mm", "Incompatible dimensions"]),
    ]:
        out = tmp_path / f"{path.stem}.plan.json"
        r = run_cli("partition", str(path), "-d", "raspberry-pi5", "-o", str(out))
        _one_line(r, path, *texts)
        assert not out.exists()


@pytest.mark.slow
def test_defect10_huge_input_shape_names_the_model_the_input_and_the_bytes(tmp_path):
    p = huge_input(_case_dir(tmp_path))
    r = run_cli("partition", str(p), "-o", str(tmp_path / "plan.json"))
    _one_line(r, p, "input 'x' of shape [1, 3, 100000, 200000] needs 240.0 GB")


@pytest.mark.slow
def test_a_string_input_partitions(tmp_path):
    p = string_input(_case_dir(tmp_path))
    r = run_cli("partition", str(p), "-d", "raspberry-pi5", "-o", str(tmp_path / "plan.json"), "-q")
    assert r.returncode == 0, r.stderr


def test_defect12_zero_size_dimension_is_not_called_dynamic(tmp_path):
    p = zero_size_dim(_case_dir(tmp_path))
    with pytest.raises(ModelLoadError) as info:
        load_model(p)
    msg = str(info.value)
    assert "zero-size dimension [1, 0, 4]" in msg
    assert "dynamic" not in msg and "--input-shape" not in msg  # no hint that --input-shape rejects


@pytest.mark.slow
def test_value_dependent_shapes_fold_from_sample_inputs(tmp_path):
    p = value_dependent(_case_dir(tmp_path))
    shape = np.array([3, 4], np.int64)
    g = load_model(p, input_values={"shape": shape})
    assert g.tensors["y"].shape == (3, 4)
    np.testing.assert_array_equal(g.sample_inputs["shape"], shape)
    with pytest.raises(ModelLoadError, match=r"--input shape is int32, the model takes int64"):
        load_model(p, input_values={"shape": shape.astype(np.int32)})
    np.save(tmp_path / "shape.npy", shape)
    out = tmp_path / "plan.json"
    r = run_cli(
        "partition",
        str(p),
        "-d",
        "raspberry-pi5",
        "--input",
        f"shape={tmp_path / 'shape.npy'}",
        "-o",
        str(out),
    )
    assert r.returncode == 0 and out.exists(), r.stderr
    # a plan records shapes, not sample values: compile takes --input too
    r = run_cli("compile", str(p), "--plan", str(out), "-o", str(tmp_path / "bundle"))
    assert r.returncode == 2 and "--input shape=FILE.npy" in r.stderr, r.stderr
    r = run_cli(
        "compile",
        str(p),
        "--plan",
        str(out),
        "--input",
        f"shape={tmp_path / 'shape.npy'}",
        "-o",
        str(tmp_path / "b"),
    )
    assert r.returncode == 0 and (tmp_path / "b" / "manifest.json").exists(), r.stderr


@pytest.mark.slow
def test_value_dependent_model_deploys_with_its_sample_inputs(tmp_path):
    import onnxruntime as ort

    import edgesplit
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.runtime.session import load

    p = value_dependent(_case_dir(tmp_path))
    shape = np.array([3, 4], np.int64)
    x = rand(1, 4)
    edgesplit.deploy(
        p,
        "host",
        tmp_path / "bundle",
        input_values={"shape": shape},
        profiling=ProfileOptions(runs=2),
    )
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "shape": shape}
    )[0]
    with load(tmp_path / "bundle") as sess:
        np.testing.assert_allclose(sess.run({"x": x, "shape": shape})["y"], want)


@pytest.mark.slow
def test_sample_inputs_travel_in_the_pipeline_choices(tmp_path):
    """``input_values`` is a field of the pipeline's Choices, as ``input_shapes`` is: the API,
    ``resolve`` and the deploy command's ``--input`` all load the model with it."""
    import onnxruntime as ort

    import edgesplit
    from edgesplit.runtime.session import load
    from edgesplit.workflows.resolve import Choices, resolve

    p = value_dependent(_case_dir(tmp_path))
    shape = np.array([3, 4], np.int64)
    problem = resolve(p, "raspberry-pi5", Choices(input_values={"shape": shape}))
    assert problem.graph.tensors["y"].shape == (3, 4)
    plan = edgesplit.partition(p, "raspberry-pi5", input_values={"shape": shape})
    assert plan.input_shapes == {"x": (1, 4), "shape": (2,)}
    np.save(tmp_path / "shape.npy", shape)
    bundle = tmp_path / "bundle"
    r = run_cli(
        "deploy",
        str(p),
        "--input",
        f"shape={tmp_path / 'shape.npy'}",
        "--runs",
        "2",
        "-o",
        str(bundle),
    )
    assert r.returncode == 0, r.stderr
    x = rand(1, 4)
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "shape": shape}
    )
    with load(bundle) as sess:
        np.testing.assert_allclose(sess.run({"x": x, "shape": shape})["y"], want[0])
