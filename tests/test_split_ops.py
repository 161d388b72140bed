"""Operators split across processors: pieces by rows or by output channels, written into the model,
must compute what the whole operator does; plans carry them through compile and the runtime."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import make_model, max_examples, rand
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import edgesplit
from edgesplit.errors import PlanError
from edgesplit.model.feeds import random_inputs
from edgesplit.model.pieces import Split, channel_axis, channel_segment, rewrite, split_bands
from edgesplit.model.rows import join, row_segments

TOL = 1e-5


def _run(graph) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(
        graph.model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return sess.run(None, random_inputs(graph, 0))


def _load(tmp_path, model: onnx.ModelProto, name: str = "m.onnx"):
    path = tmp_path / name
    onnx.save(model, path)
    return edgesplit.load_model(path)


def _close(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=TOL, atol=TOL)


def _shares(draw, n: int) -> list[float]:
    return [draw(st.floats(0.05, 1.0)) for _ in range(n)]


@st.composite
def _conv_heads(draw):
    """A Conv (random kernel, stride, padding, dilation; a bias or not) and what may follow it:
    BatchNormalization, a residual Add of a same-shape activation, an activation."""
    cin, cout = draw(st.integers(1, 8)), draw(st.integers(2, 24))
    k, s, d = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    p = draw(st.integers(0, k - 1))
    hw = draw(st.integers(2 * d * k, 14))
    bias = draw(st.booleans())
    weights = [("w", rand(cout, cin, k, k, seed=1))] + ([("b", rand(cout, seed=2))] if bias else [])
    conv = helper.make_node(
        "Conv",
        ["x", "w"] + (["b"] if bias else []),
        ["c"],
        name="conv",
        strides=[s, s],
        pads=[p, p, p, p],
        dilations=[d, d],
    )
    h = (hw + 2 * p - d * (k - 1) - 1) // s + 1
    nodes, last = [conv], "c"
    inputs = [("x", [1, cin, hw, hw])]
    if draw(st.booleans()):
        weights += [
            (n, np.abs(rand(cout, seed=3 + i)) + 0.5)
            for i, n in enumerate(["sc", "bi", "mu", "va"])
        ]
        nodes.append(
            helper.make_node(
                "BatchNormalization", [last, "sc", "bi", "mu", "va"], ["bn"], name="bn"
            )
        )
        last = "bn"
    if draw(st.booleans()):
        inputs.append(("r", [1, cout, h, h]))
        nodes.append(helper.make_node("Add", [last, "r"], ["sum"], name="add"))
        last = "sum"
    act = draw(st.sampled_from(["Relu", "Sigmoid", None]))
    if act:
        nodes.append(helper.make_node(act, [last], ["act"], name="act"))
        last = "act"
    nodes.append(
        helper.make_node("Identity", [last], ["y"], name="out")
    )  # a reader after the chain
    return (
        make_model(nodes, inputs, [("y", [1, cout, h, h])], weights),
        cout,
        _shares(draw, draw(st.integers(2, 3))),
    )


@settings(max_examples=max_examples(40), deadline=None)
@given(_conv_heads())
def test_a_conv_split_by_channels_is_the_whole_conv(tmp_path_factory, case):
    """Random channel shares of a Conv and the per-channel nodes after it: the pieces and their
    join give the whole node's output within 1e-5."""
    model, cout, shares = case
    graph = _load(tmp_path_factory.mktemp("ch"), model)
    head = next(i for i, n in enumerate(graph.nodes) if n.op_type == "Conv")  # BN may be folded in
    chain = channel_segment(graph, head)
    assert chain is not None
    names = tuple(graph.nodes[k].name for k in chain)
    y = graph.nodes[chain[-1]].outputs[0]
    bands = split_bands(cout, shares)
    if len(bands) < 2:
        return
    split = Split("channels", names, graph.nodes[head].inputs[0], y, bands, ("a",) * len(bands))
    rewritten = rewrite(graph, [split])
    assert any(n.op_type == "Concat" for n in rewritten.nodes)
    _close(_run(graph), _run(rewritten))


@st.composite
def _gemms(draw):
    k, n = draw(st.integers(1, 12)), draw(st.integers(2, 24))
    op = draw(st.sampled_from(["Gemm", "GemmT", "MatMul"]))
    if op == "MatMul":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm")]
        weights = [("w", rand(k, n, seed=1))]
        rows = [1, draw(st.integers(1, 5)), k]
    else:
        t = op == "GemmT"
        w = rand(n, k, seed=1) if t else rand(k, n, seed=1)
        nodes = [
            helper.make_node(
                "Gemm", ["x", "w", "b"], ["m"], name="mm", transB=int(t), alpha=0.5, beta=2.0
            )
        ]
        weights = [("w", w), ("b", rand(n, seed=2))]
        rows = [draw(st.integers(1, 4)), k]
    nodes += [
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
        helper.make_node("Identity", ["y"], ["z"], name="out"),
    ]
    out_shape = [*rows[:-1], n]
    return (
        make_model(nodes, [("x", rows)], [("z", out_shape)], weights),
        n,
        _shares(draw, draw(st.integers(2, 3))),
    )


@settings(max_examples=max_examples(40), deadline=None)
@given(_gemms())
def test_a_gemm_or_matmul_split_by_output_features_is_the_whole_node(tmp_path_factory, case):
    model, n, shares = case
    graph = _load(tmp_path_factory.mktemp("gemm"), model)
    head = next(i for i, n in enumerate(graph.nodes) if n.op_type in ("Gemm", "MatMul"))
    chain = channel_segment(graph, head)
    out = graph.nodes[head].outputs[0]
    assert chain is not None and channel_axis(graph, chain[0]) == len(graph.tensors[out].shape) - 1
    bands = split_bands(n, shares)
    if len(bands) < 2:
        return
    names = tuple(graph.nodes[k].name for k in chain)
    split = Split(
        "channels",
        names,
        graph.nodes[head].inputs[0],
        graph.nodes[chain[-1]].outputs[0],
        bands,
        ("a",) * 9,
    )
    _close(_run(graph), _run(rewrite(graph, [replace(split, processors=("a",) * len(bands))])))


@st.composite
def _stacks(draw):
    """A stack of row-local nodes: convolutions and pools of random kernel, stride, padding and
    dilation (ceil-mode pools among them), a branch joined by Add or Concat."""
    ch, hw = draw(st.integers(1, 4)), draw(st.integers(12, 40))
    nodes, weights, x, h = [], [], "x", hw
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["conv", "conv", "maxpool", "avgpool", "branch"]))
        k = draw(st.integers(1, 3))
        s = draw(st.integers(1, 2)) if h >= 6 else 1
        p = draw(st.integers(0, k - 1))
        if kind == "conv":
            d = draw(st.integers(1, 2)) if h > 8 else 1
            weights.append((f"w{i}", rand(ch, ch, k, k, seed=i)))
            nodes.append(
                helper.make_node(
                    "Conv",
                    [x, f"w{i}"],
                    [f"t{i}"],
                    name=f"conv{i}",
                    strides=[s, s],
                    pads=[p, p, p, p],
                    dilations=[d, d],
                )
            )
            h = (h + 2 * p - d * (k - 1) - 1) // s + 1
        elif kind in ("maxpool", "avgpool"):
            ceil = draw(st.integers(0, 1)) if kind == "maxpool" else 0
            op = "MaxPool" if kind == "maxpool" else "AveragePool"
            nodes.append(
                helper.make_node(
                    op,
                    [x],
                    [f"t{i}"],
                    name=f"pool{i}",
                    kernel_shape=[k, k],
                    strides=[s, s],
                    pads=[p, p, p, p],
                    ceil_mode=ceil,
                )
            )
            span = h + 2 * p - k
            h = (-(-span // s) if ceil else span // s) + 1
        else:
            weights += [
                (f"wa{i}", rand(ch, ch, 3, 3, seed=10 + i)),
                (f"wb{i}", rand(ch, ch, 1, 1, seed=20 + i)),
            ]
            join_op = draw(st.sampled_from(["Add", "Concat"]))
            nodes += [
                helper.make_node("Conv", [x, f"wa{i}"], [f"a{i}"], name=f"a{i}", pads=[1, 1, 1, 1]),
                helper.make_node("Relu", [f"a{i}"], [f"ar{i}"], name=f"ar{i}"),
                helper.make_node("Conv", [x, f"wb{i}"], [f"b{i}"], name=f"b{i}"),
                helper.make_node(
                    join_op,
                    [f"ar{i}", f"b{i}"],
                    [f"t{i}"],
                    name=f"j{i}",
                    **({"axis": 1} if join_op == "Concat" else {}),
                ),
            ]
            if join_op == "Concat":
                weights.append((f"wc{i}", rand(ch, 2 * ch, 1, 1, seed=30 + i)))
                nodes.append(helper.make_node("Conv", [f"t{i}", f"wc{i}"], [f"u{i}"], name=f"c{i}"))
                x = f"u{i}"
                continue
        x = f"t{i}"
        if h < 2:
            break
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    out = helper.make_tensor_value_info(
        "y", onnx.TensorProto.FLOAT, [1, ch, "h", "w"]
    )  # inferred at load
    return make_model(nodes, [("x", [1, ch, hw, hw])], [out], weights), _shares(
        draw, draw(st.integers(2, 3))
    )


@pytest.mark.slow
@settings(max_examples=max_examples(60), deadline=None)
@given(_stacks())
def test_a_row_split_of_a_conv_and_pool_stack_is_the_whole_stack(tmp_path_factory, case):
    """Random stacks of convolutions, pools and branches, split by rows at random shares (halos and
    the image's edges in every piece): the pieces and their join give the stack's output."""
    model, shares = case
    graph = _load(tmp_path_factory.mktemp("rows"), model)
    units = row_segments(graph)
    if not units:
        return
    run = [units[0]]
    for u in units[1:]:
        if u.input != run[-1].output:
            break
        run.append(u)
    seg = join(run)
    bands = split_bands(seg.out_height, shares)
    if len(bands) < 2:
        return
    names = tuple(graph.nodes[k].name for k in seg.nodes)
    split = Split("rows", names, seg.input, seg.output, bands, ("a",) * len(bands))
    _close(_run(graph), _run(rewrite(graph, [split])))


def test_a_split_that_does_not_fit_is_refused(tmp_path):
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    graph = _load(
        tmp_path,
        make_model(nodes, [("x", [1, 2, 8, 8])], [("y", [1, 4, 8, 8])], [("w", rand(4, 2, 3, 3))]),
    )
    ok = Split("channels", ("conv", "relu"), "x", "y", ((0, 2), (2, 4)), ("a", "b"))
    rewrite(graph, [ok])
    bad = {
        "bands": Split("channels", ("conv", "relu"), "x", "y", ((0, 2), (3, 4)), ("a", "b")),
        "one band": Split("channels", ("conv", "relu"), "x", "y", ((0, 4),), ("a",)),
        "kind": Split("diagonal", ("conv", "relu"), "x", "y", ((0, 2), (2, 4)), ("a", "b")),
        "nodes": Split("channels", ("conv", "nosuch"), "x", "y", ((0, 2), (2, 4)), ("a", "b")),
        "rows": Split("rows", ("relu",), "x", "y", ((0, 4), (4, 8)), ("a", "b")),
    }
    for what, split in bad.items():
        with pytest.raises(PlanError, match="split of y"):
            rewrite(graph, [split])
        assert what  # the case's name, for a failure's traceback


@pytest.mark.slow
@pytest.mark.measures
def test_a_plan_with_split_operators_compiles_runs_and_is_priced(tmp_path):
    """host-biglittle, a conv chain split by rows 70/30 between big and little: the plan
    round-trips through plan.json, compiles (each part checked against the model with the split
    written in) and runs to the whole model's outputs, its pieces on big and little at once; each
    piece's part measures what the plan predicts for it within a factor of 1.6 (the
    micro-measurement
    of the split's pricing), and ``--split-operators`` plans run through the CLI."""
    from conftest import run_cli

    from edgesplit.optimize.planner import plan_with_splits, solve_plan
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.workflows.resolve import Choices, resolve

    nodes, weights, x = [], [], "x"
    for i in range(4):
        weights.append((f"w{i}", rand(32, 32 if i else 3, 3, 3, seed=i)))
        nodes += [
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    nodes += [helper.make_node("GlobalAveragePool", [x], ["y"], name="gap")]
    path = tmp_path / "chain.onnx"
    onnx.save(make_model(nodes, [("x", [1, 3, 96, 96])], [("y", [1, 32, 1, 1])], weights), path)
    problem = resolve(
        str(path), "host-biglittle", Choices(profiling=ProfileOptions(["ort"], runs=5))
    )
    base = solve_plan(problem)
    seg = join(row_segments(problem.graph))
    names = tuple(problem.graph.nodes[k].name for k in seg.nodes)
    split = Split(
        "rows",
        names,
        seg.input,
        seg.output,
        split_bands(seg.out_height, [0.7, 0.3]),
        ("big", "little"),
    )
    plan = plan_with_splits(
        problem,
        replace(
            base, assignment={n: {"processor": "big", "backend": "ort"} for n in base.assignment}
        ),
        [split],
    )
    plan.save(tmp_path / "plan.json")
    plan = edgesplit.load_plan(tmp_path / "plan.json")
    assert plan.splits and {p.processor for p in plan.parts} == {"big", "little"}
    from edgesplit.optimize.annotate import annotate_model
    from edgesplit.optimize.split import for_plan

    annotated = annotate_model(
        for_plan(problem.graph, plan.splits)[0].model, plan
    )  # partition's copy
    assert {n.name for n in annotated.graph.node} == set(plan.assignment)
    problem.profile.save(tmp_path / "chain.profile.json")
    r = run_cli(
        "compile", str(path), "--plan", str(tmp_path / "plan.json"), "-o", str(tmp_path / "b")
    )
    assert r.returncode == 0, r.stderr
    feeds = random_inputs(problem.graph, 1)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)[
        0
    ]
    with edgesplit.load(tmp_path / "b") as sess:
        np.testing.assert_allclose(sess.run(feeds)["y"], want, rtol=1e-4, atol=1e-5)
        for _ in range(30):
            sess.run(feeds)
        stats = {p.name: p for p in sess.stats().parts}
    predicted = {p.name: p.latency_ms for p in plan.parts}
    pieces = [p for p in plan.parts if any("@" in n for n in p.nodes) and len(p.nodes) > 1]
    assert {p.processor for p in pieces} == {"big", "little"}
    from edgesplit.device.throttle_fit import told_share

    for p in pieces:
        got = stats[p.name].median_ms
        assert 1 / 1.6 <= got / predicted[p.name] <= 1.6, (
            p.name,
            p.processor,
            got,
            predicted[p.name],
            # what the little core's spinner is told (fitted quietly before the run: 0.5-0.55 here)
            told_share(1, 0.4, 200),
        )
    r = run_cli(
        "partition",
        str(path),
        "-d",
        "host-biglittle",
        "--profile",
        str(tmp_path / "chain.profile.json"),
        "--split-operators",
        "-o",
        str(tmp_path / "auto.json"),
        "-q",
    )
    assert r.returncode == 0, (
        r.stderr
    )  # with or without splits (the prediction decides), annotated too
    plan = edgesplit.load_plan(tmp_path / "auto.json")
    annotated = onnx.load(tmp_path / "auto.onnx")
    assert {n.name for n in annotated.graph.node} == set(plan.assignment)
