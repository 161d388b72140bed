"""Control flow: If, Loop and Scan are atomic nodes whose subgraphs' outer-scope reads are inputs.

The model of ``model_builders.control_flow_model`` has an If whose branches read outer tensors
(and an initializer), a Loop and a Scan whose bodies do too. It is split into 2 and 3 parts
(contiguous cuts, a hand-made cut that separates the If from what its branches read, and an
optimiser plan with pins), and every bundle must give the whole model's outputs, on both
branches of the If.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_builders import control_flow_model, nested_model

from edgesplit.backends.ort.profile import _kernel_times, map_regions, profile_ort
from edgesplit.compile.manual import contiguous_plan, part_boundaries
from edgesplit.device.spec import load_device
from edgesplit.model.load import load_model
from edgesplit.optimize.plan import Part
from edgesplit.profile.run import ProfileOptions
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.resolve import partition

BRANCH_INPUTS = {
    "then": np.abs(np.random.default_rng(1).standard_normal((1, 8))).astype(np.float32) + 0.1,
    "else": -np.abs(np.random.default_rng(2).standard_normal((1, 8))).astype(np.float32) - 0.1,
}


@pytest.fixture(scope="module")
def cf_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("cf") / "cf.onnx"
    onnx.save(control_flow_model(), p)
    return p


@pytest.fixture(scope="module")
def nested_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("nested") / "nested.onnx"
    onnx.save(nested_model(), p)
    return p


def _whole(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _check_bundle(path, bundle):
    with load(bundle) as sess:
        for x in BRANCH_INPUTS.values():
            got = sess.run({"x": x})["y"]
            np.testing.assert_allclose(got, _whole(path, x), rtol=1e-5, atol=1e-6)


def test_outer_scope_reads_are_node_inputs(cf_path):
    g = load_model(cf_path)
    iff, loop = g.nodes[g.index["iff"]], g.nodes[g.index["loop"]]
    assert set(iff.outer_inputs) == {"a", "b"} and set(iff.outer_inputs) <= set(iff.inputs)
    assert loop.outer_inputs == ("a",)
    # consumers (hence the optimiser's flows) include the control-flow nodes
    assert g.index["iff"] in g.consumers["b"] and g.index["loop"] in g.consumers["a"]
    assert ("a" in iff.inputs) and iff.bytes_read >= g.tensors["a"].nbytes + g.tensors["b"].nbytes
    # FLOPs: the costlier branch of the If; the Loop's body times its 3 trips
    assert iff.flops == 8 and loop.flops == 3 * 8


def test_split_into_2_and_3_contiguous_parts_matches_whole_model(cf_path, tmp_path):
    g = load_model(cf_path)
    for k in (2, 3):
        plan = contiguous_plan(
            g, "host-biglittle", [("big", "ort"), ("little", "ort"), ("big", "ort")][:k]
        )
        assert len(plan.parts) == k
        compile_bundle(g, plan, tmp_path / f"b{k}")
        _check_bundle(cf_path, tmp_path / f"b{k}")


def _hand_plan(g, groups):
    """A plan from explicit node groups (in topological order), alternating big and little."""
    plan = contiguous_plan(g, "host-biglittle", [("big", "ort")])
    parts = tuple(
        Part(
            name=f"p{k}",
            processor="big" if k % 2 == 0 else "little",
            backend="ort",
            nodes=tuple(g.nodes[i].name for i in grp),
            inputs=tuple(ins),
            outputs=tuple(outs),
        )
        for k, ((ins, outs), grp) in enumerate(zip(part_boundaries(g, groups), groups))
    )
    assignment = {n: {"processor": p.processor, "backend": "ort"} for p in parts for n in p.nodes}
    return replace(plan, parts=parts, assignment=assignment)


def test_part_boundary_carries_outer_scope_reads(cf_path, tmp_path):
    g = load_model(cf_path)
    names = [n.name for n in g.nodes]
    cut1, cut2 = names.index("iff"), names.index("loop")
    # p0 makes a and b; p1 is the If alone (its branches read a and b); p2 has the Loop (reads a)
    groups = [list(range(cut1)), [cut1], list(range(cut1 + 1, len(names)))]
    plan = _hand_plan(g, groups)
    assert {"a", "b", "cond"} <= set(plan.parts[1].inputs)
    assert "a" in plan.parts[2].inputs and cut2 in groups[2]
    compile_bundle(g, plan, tmp_path / "hand")
    _check_bundle(cf_path, tmp_path / "hand")


@pytest.mark.slow
def test_optimiser_plan_with_pins_splits_control_flow(cf_path, tmp_path):
    g = load_model(cf_path)
    pins = {"iff": "little", "loop": "big", "scan": "little", "relu": "big", "mul": "big"}
    plan = partition(g, "host-biglittle", pins=pins, profiling=ProfileOptions(runs=3))
    assert len(plan.parts) >= 3
    by_node = {n: p.processor for p in plan.parts for n in p.nodes}
    assert all(by_node[n] == proc for n, proc in pins.items())
    compile_bundle(g, plan, tmp_path / "pinned")
    _check_bundle(cf_path, tmp_path / "pinned")


def test_nested_subgraph_reads_two_scopes_up(nested_path, tmp_path):
    g = load_model(nested_path)
    assert g.nodes[g.index["outer_loop"]].outer_inputs == ("top",)
    for k in (2, 3):
        plan = contiguous_plan(
            g, "host-biglittle", [("big", "ort"), ("little", "ort"), ("big", "ort")][:k]
        )
        compile_bundle(g, plan, tmp_path / f"n{k}")
        _check_bundle(nested_path, tmp_path / f"n{k}")


@pytest.mark.slow
def test_profile_attributes_subgraph_time_to_the_control_flow_node(cf_path, tmp_path):
    g = load_model(cf_path)
    proc = load_device("host").processors[0]
    entry = profile_ort(g, proc, proc.backend("ort"), runs=5, warmup=2)
    assert set(entry.nodes) == {n.name for n in g.nodes}  # no subgraph kernel shows up as a node
    for name in ("iff", "loop", "scan"):
        assert entry.nodes[name].latency_ms > 0, name
    # ORT reports subgraph kernels as events of their own, nested in time inside the control-flow
    # node's event (which covers them): they are dropped, so a body's time counts once
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "trace")
    sess = ort.InferenceSession(str(cf_path), so, providers=["CPUExecutionProvider"])
    for x in BRANCH_INPUTS.values():
        sess.run(None, {"x": x})
    times = _kernel_times(sess.end_profiling())
    assert {len(times[n]) for n in ("iff", "loop", "scan")} == {2}
    assert not any(
        k.startswith(("iff_then", "iff_else", "loop_body", "scan_body")) for k in times
    ), times
    # the If's region covers the If alone, not the nodes that produce what its branches read
    for names, covered in map_regions(g, g.model.graph):
        if "iff" in names:
            assert covered == [g.index["iff"]]


@pytest.mark.slow
def test_deploy_control_flow_model_matches_whole_model(cf_path, tmp_path):
    import edgesplit

    edgesplit.deploy(cf_path, "host", tmp_path / "bundle", profiling=ProfileOptions(runs=2))
    _check_bundle(cf_path, tmp_path / "bundle")
