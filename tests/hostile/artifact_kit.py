"""What the hostile-artifact tests share (test_artifacts.py, test_artifacts_corpus.py): the CLI run
in this process, the one-line refusal check, and the module's fixed inputs, built once per module.
A test module imports the fixtures it uses (``w``, ``bundle``, ``tvm_bundle``) by their function
names.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, rand
from onnx import helper

from edgesplit.bundle.signing import generate_key
from edgesplit.cli.main import main
from edgesplit.compile.manual import contiguous_plan
from edgesplit.model.load import load_model
from edgesplit.profile.store import NodeCost, ProcessorProfile, Profile
from edgesplit.workflows.compile import compile_bundle

pytestmark = pytest.mark.timeout(120)

SPEC = """\
name: hostile
kind: device
local: true
processors:
  cpu:
    kind: cpu
    peak_gflops: 50
    mem_bandwidth_gbps: 10
    active_w: 2
    idle_w: 0.5
    backends: [{runtime: ort}, {runtime: tvm, target: {kind: llvm}}]
  cpu2: {kind: cpu, peak_gflops: 20, mem_bandwidth_gbps: 5, active_w: 1, idle_w: 0.2,
         backends: [{runtime: ort}]}
"""


# ---- helpers


def cli(*args) -> tuple[int, str]:
    """Run ``edgesplit ARGS`` here; the exit code and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def refused(result: tuple[int, str], *needles: str, file: str | os.PathLike | None = None) -> str:
    """Exit 2 with one line naming ``file`` and holding every needle; no traceback."""
    code, err = result
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("edgesplit: error: "), err
    assert "Traceback" not in err
    for n in ([str(file)] if file is not None else []) + list(needles):
        assert n in lines[0], (n, lines[0])
    return lines[0]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its sha256 (to show that nothing was written or removed)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_symlink() or not p.is_dir():
            out[str(p.relative_to(root))] = "special"
    return out


@contextlib.contextmanager
def nothing_written(root: Path):
    before = tree(root)
    yield
    assert tree(root) == before


def write_json(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def npy(path: Path, arr) -> Path:
    with open(path, "wb") as f:
        np.save(f, arr, allow_pickle=True)
    return path


# ---- fixtures, built once


@pytest.fixture(scope="module", name="w")
def w_fixture(tmp_path_factory):
    """The module's fixed inputs: a 4-node model, a 2-processor spec, a profile, a 2-part plan, an
    ORT bundle, and a key pair. Tests copy what they change."""
    d = tmp_path_factory.mktemp("hostile")
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Sigmoid", ["r"], ["s"], name="sig"),
            helper.make_node("Mul", ["r", "s"], ["y"], name="mul"),
        ],
        [("x", [1, 3, 8, 8])],
        [("y", [1, 4, 8, 8])],
        [("w", rand(4, 3, 3, 3))],
    )
    onnx.save(model, d / "m.onnx")
    (d / "dev.yaml").write_text(SPEC)
    graph = load_model(d / "m.onnx")
    cost = NodeCost(0.01, 0.012, "measured", 0.02, 5)
    entries = tuple(
        ProcessorProfile(proc, "ort", "measured", {n.name: cost for n in graph.nodes})
        for proc in ("cpu", "cpu2")
    )
    Profile(graph.sha256, graph.name, "hostile", graph.input_shapes(), entries).save(
        d / "prof.json"
    )
    plan = contiguous_plan(graph, str(d / "dev.yaml"), [("cpu", "ort"), ("cpu2", "ort")])
    plan.save(d / "plan.json")
    compile_bundle(graph, plan, d / "bundle")
    private, public, _ = generate_key(d / "key")
    other, other_pub, _ = generate_key(d / "other")
    return {
        "dir": d,
        "model": d / "m.onnx",
        "spec": d / "dev.yaml",
        "profile": d / "prof.json",
        "plan": d / "plan.json",
        "bundle": d / "bundle",
        "key": private,
        "pub": public,
        "other": other,
        "other_pub": other_pub,
        "graph": graph,
        "plan_obj": plan,
    }


@pytest.fixture(scope="module", name="tvm_bundle")
def tvm_bundle_fixture(w):
    """A bundle whose first part is a TVM library, signed with the module's key."""
    plan = contiguous_plan(w["graph"], str(w["spec"]), [("cpu", "tvm"), ("cpu2", "ort")])
    out = w["dir"] / "tvm_bundle"
    m = compile_bundle(w["graph"], plan, out, sign_key=w["key"])
    assert m.parts[0].backend == "tvm", m.parts[0].note
    return out


@pytest.fixture(name="bundle")
def bundle_fixture(w, tmp_path) -> Path:
    b = tmp_path / "b"
    shutil.copytree(w["bundle"], b)
    return b


def manifest_of(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def partition(w, tmp_path, *extra, profile=None, spec=None):
    return cli(
        "partition",
        w["model"],
        "-d",
        spec or w["spec"],
        "--profile",
        profile or w["profile"],
        "-o",
        tmp_path / "plan.json",
        "-q",
        *extra,
    )


def run(bundle, *extra):
    return cli("run", bundle, "--repeat", 1, "--warmup", 0, *extra)


# ---- defects 1-12, each by name
