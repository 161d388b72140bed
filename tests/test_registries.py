"""Backends and objectives are plug-ins: one table each, keyed by name, and nothing else branches
on their names. A toy backend registered at run time goes through profile, partition, compile and
run; the layering holds (compile does not import the runtime, and no runtime module imports
another in a cycle)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import toy_backend

import edgesplit
from edgesplit.errors import DeviceSpecError
from edgesplit.model import zoo

PKG = Path(edgesplit.__file__).resolve().parent

TOY_DEVICE = f"""\
name: toyboard
kind: device
local: true
processors:
  cpu:
    kind: cpu
    cores: [0]
    threads: 1
    peak_gflops: 50
    mem_bandwidth_gbps: 10
    active_w: 3.0
    idle_w: 1.0
    backends:
      - runtime: {toy_backend.NAME}
"""


@pytest.fixture
def toy():
    entries = toy_backend.register()
    toy_backend.RUNS.clear()
    yield toy_backend
    toy_backend.unregister(entries)


def test_a_toy_backend_runs_end_to_end(toy, tmp_path):
    """Registered by one module and one line per table: profiled (measured, not predicted),
    planned, compiled and run by its own classes, with the whole model's outputs."""
    model = zoo.save("tiny_dag", tmp_path / "tiny.onnx")
    (tmp_path / "toy.yaml").write_text(TOY_DEVICE)
    device = edgesplit.load_device(tmp_path / "toy.yaml")
    graph = edgesplit.load_model(model)
    prof = edgesplit.profile_model(graph, device, edgesplit.ProfileOptions(runs=3, warmup=1))
    entry = prof.entry("cpu", toy.NAME)
    assert entry is not None and entry.source == "measured" and entry.whole_model_ms > 0
    assert set(entry.nodes) == {
        n.name for n in graph.nodes
    }  # unoptimised: ORT's kernels are our nodes

    plan = edgesplit.partition(graph, device, profile=prof)
    assert {p.backend for p in plan.parts} == {toy.NAME}
    manifest = edgesplit.compile_bundle(graph, plan, tmp_path / "bundle")
    assert {p.backend for p in manifest.parts} == {toy.NAME}

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )[0]
    with edgesplit.load(tmp_path / "bundle") as session:
        got = session.run({"input": x})["logits"]
    assert toy.RUNS == [p.name for p in manifest.parts]  # the toy's executor ran every part
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_unregistered_backend_is_refused_by_the_spec_schema(tmp_path):
    """The schema's runtime enum is the backend table: without the entry, the spec is invalid."""
    from edgesplit.device.spec import BACKENDS

    (tmp_path / "toy.yaml").write_text(TOY_DEVICE)
    known = re.escape(str(list(BACKENDS)))
    with pytest.raises(
        DeviceSpecError, match=rf"runtime: '{toy_backend.NAME}' is not one of {known}"
    ):
        edgesplit.load_device(tmp_path / "toy.yaml")


def test_objectives_come_from_one_table():
    from edgesplit.optimize.objectives import OBJECTIVES, Objective

    assert list(OBJECTIVES) == ["latency", "latency_sequential", "energy", "throughput", "pareto"]
    assert all(isinstance(o, Objective) and o.name == k for k, o in OBJECTIVES.items())


def _sources(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, path.read_text()


def test_nothing_branches_on_backend_or_objective_names():
    """``grep -rn "if .*backend ==" edgesplit/`` finds nothing, nor a comparison of a backend's
    runtime or an objective with a literal name."""
    pattern = re.compile(
        r"""(backend|runtime|objective)[\w.]*\s*[!=]=\s*["'](ort|tvm|remote|latency|energy|throughput|pareto)"""
    )
    hits = [
        f"{path.relative_to(PKG)}:{i}: {line.strip()}"
        for path, text in _sources(PKG)
        for i, line in enumerate(text.splitlines(), 1)
        if re.search(r"if .*backend ==", line) or pattern.search(line)
    ]
    assert not hits, "\n".join(hits)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path, m, n]
            if n not in state and (found := visit(n, [*path, m])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [])):
            return found
    return None


def test_compile_never_imports_the_runtime_and_runtime_modules_have_no_cycle():
    """Imports inside functions count too: the old cycle was executors -> remote (lazily) ->
    executors."""
    for path, _ in _sources(PKG / "compile"):
        bad = sorted(m for m in _imports(path) if m.startswith("edgesplit.runtime"))
        assert not bad, f"{path.name} imports {bad}"
    graph = {
        f"edgesplit.runtime.{p.stem}": {
            m for m in _imports(p) if m.startswith("edgesplit.runtime.")
        }
        for p, _ in _sources(PKG / "runtime")
    }
    assert _cycle(graph) is None, _cycle(graph)
    code = (
        "import sys, edgesplit.compile.build, edgesplit.compile.backends; "
        "bad = [m for m in sys.modules if m.startswith('edgesplit.runtime')]; print(bad); "
        "sys.exit(bool(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
