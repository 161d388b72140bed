"""The baselines a user would pick instead, in the verification: plain ONNX Runtime over every CPU
core, ORT's own provider assignment, and for a stream whole-model replicas from one queue."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import conv_chain

import edgesplit
from edgesplit.bundle.format import open_bundle
from edgesplit.errors import BundleError
from edgesplit.optimize.planner import solve_plan
from edgesplit.profile.run import ProfileOptions
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.resolve import Choices, resolve
from edgesplit.workflows.verify.candidates import PLAIN_ORT, REPLICAS, candidates


def _chain(path, ch: int = 64, hw: int = 56, n: int = 4) -> str:
    """Conv/Relu x n: about 20 ms on one core here, and ORT's two threads nearly halve it."""
    return conv_chain(path, ch, hw, n, scale=3.0)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("honest")
    model = _chain(root / "chain.onnx")
    problem = resolve(model, "host-2core", Choices(profiling=ProfileOptions(["ort"], runs=5)))
    prof = root / "chain.profile.json"
    problem.profile.save(prof)
    return model, prof, problem


@pytest.mark.slow  # its fixture profiles a model on three processors
def test_the_candidates_are_the_baselines_a_user_would_pick(chain):
    model, _, problem = chain
    plan = solve_plan(problem)
    names = [c.name for c in candidates(problem, plan, "latency")]
    assert names[:2] == ["plan", PLAIN_ORT] and "ort-greedy" in names and REPLICAS not in names
    plain = next(c for c in candidates(problem, plan, "latency") if c.name == PLAIN_ORT)
    assert plain.plan is not None and plain.plan.parts[0].processor == "core0+core1"
    assert "every CPU core" in plain.summary and "2 threads" in plain.summary
    stream = {c.name: c for c in candidates(problem, plan, "throughput")}
    rep = stream[REPLICAS].plan
    assert rep is not None and rep.parts[0].processor == "core0" and rep.replicas == ("core1",)
    one = stream["only:core0"].plan.predicted.period_ms
    assert rep.predicted.period_ms < one  # two copies take requests from one queue


@pytest.mark.slow  # its fixture profiles a model on three processors
def test_a_bundle_of_replicas_runs_each_request_on_one_copy(chain, tmp_path):
    model, _, problem = chain
    plan = next(
        c for c in candidates(problem, solve_plan(problem), "throughput") if c.name == REPLICAS
    ).plan
    manifest = compile_bundle(problem.graph, plan, tmp_path / "b", device=problem.full_device)
    assert [p.processor for p in manifest.parts] == ["core0", "core1"]
    assert (
        manifest.replicas == (("p0",), ("p0_r1",))
        and manifest.parts[0].onnx_file == manifest.parts[1].onnx_file
    )
    x = np.random.default_rng(0).standard_normal((1, 64, 56, 56)).astype(np.float32)
    want = edgesplit.load(tmp_path / "b").run({"x": x})
    with edgesplit.load(tmp_path / "b") as sess:
        outs = list(sess.run_stream([{"x": x}] * 12))
        runs = {p.name: p.runs for p in sess.stats().parts}
    for out in outs:
        np.testing.assert_allclose(out["r3"], want["r3"], rtol=1e-5, atol=1e-6)
    assert runs["p0"] + runs["p0_r1"] == 12 and min(runs.values()) >= 2, runs  # both copies served


@pytest.mark.slow  # its fixture profiles a model on three processors
def test_a_manifest_of_broken_replicas_is_refused(chain, tmp_path):
    import json

    model, _, problem = chain
    plan = next(
        c for c in candidates(problem, solve_plan(problem), "throughput") if c.name == REPLICAS
    ).plan
    compile_bundle(problem.graph, plan, tmp_path / "b", device=problem.full_device)
    path = tmp_path / "b" / "manifest.json"
    good = json.loads(path.read_text())
    for replicas, says in (
        ([["p0"]], "parts in no copy of replicas: p0_r1"),
        ([["p0"], ["p0", "p0_r1"]], "part p0 is in replicas 0 and 1"),
        ([["p0"], ["nosuch"]], "replicas[1] names part nosuch"),
        ([["p0"], []], "replicas[1]: an empty copy"),
    ):
        path.write_text(json.dumps({**good, "replicas": replicas}))
        with pytest.raises(BundleError, match=says.replace("[", r"\[").replace("]", r"\]")):
            open_bundle(tmp_path / "b", verify=False)


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
@pytest.mark.measures
def test_verification_ships_plain_ort_when_the_plan_loses_to_it(chain, tmp_path):
    """Every node pinned to core0 (one thread): ONNX Runtime's two threads over both cores are
    measured faster, and that is what ships, named in the verdict."""
    model, prof, problem = chain
    pins = {n.name: "core0" for n in problem.graph.nodes}
    m = edgesplit.deploy(
        model, "host-2core", tmp_path / "b", profile=prof, pins=pins, verify_budget_s=15
    )
    v = m.verification
    assert v is not None and v.shipped == PLAIN_ORT, v.reason
    assert "plain-ort" in v.reason and not v.kept_plan
    assert v.candidate(PLAIN_ORT).measured_ms < v.candidate("plan").measured_ms
    assert [p.processor for p in open_bundle(tmp_path / "b").parts] == ["core0+core1"]
