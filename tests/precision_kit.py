"""The models, device and made-up profile that the precision tests (tests/test_precision.py)
build in code: a small classifier whose int8-capable nodes form three parts, an NPU board that runs
only those in int8, and a chain whose int8 noise is all in its second half."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import make_model, rand
from onnx import helper

from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile, Profile

ALLOWED = {"Conv", "Relu", "GlobalAveragePool", "Flatten", "Gemm", "Add"}


def split_net_model(path) -> str:
    """Conv-Relu-Conv, HardSigmoid (not on the NPU), Conv-Relu-Conv, Div (not on the NPU),
    GlobalAveragePool-Flatten-Gemm: a classifier whose int8 nodes form three parts."""

    def c(i: str, o: str, n: int):
        return helper.make_node(
            "Conv", [i, f"w{n}", f"b{n}"], [o], pads=[1, 1, 1, 1], name=f"conv{n}"
        )

    nodes = [
        c("x", "c1", 1),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        c("r1", "c2", 2),
        helper.make_node("HardSigmoid", ["c2"], ["h"], name="hsig"),
        c("h", "c3", 3),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        c("r3", "c4", 4),
        helper.make_node("Div", ["c4", "two"], ["d"], name="div"),
        helper.make_node("GlobalAveragePool", ["d"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    weights = [
        ("two", np.array(2.0, np.float32)),
        ("wf", rand(10, 16, seed=9) * 10),
        ("bf", rand(10, seed=8)),
    ]
    for n, (ci, co) in enumerate([(3, 16), (16, 16), (16, 16), (16, 16)], start=1):
        weights += [(f"w{n}", rand(co, ci, 3, 3, seed=n) * 3), (f"b{n}", rand(co, seed=10 + n))]
    onnx.save(make_model(nodes, [("x", [1, 3, 32, 32])], [("y", [1, 10])], weights), path)
    return str(path)


NPU_SPEC = """\
name: npu-board
kind: device
local: true
processors:
  cpu:
    kind: cpu
    cores: [0]
    threads: 1
    precisions: [fp32]
    peak_gflops: 100
    mem_bandwidth_gbps: 10
    active_w: 3
    idle_w: 1
    backends: [{runtime: ort}]
  npu:
    kind: npu
    cores: [1]
    threads: 1
    precisions: [int8]
    peak_gflops: 400
    mem_bandwidth_gbps: 10
    active_w: 3
    idle_w: 1
    ops: {only: [Conv, Relu, GlobalAveragePool, Flatten, Gemm, Add]}
    backends: [{runtime: ort-int8}]
default_link: {bandwidth_gbps: 8, latency_ms: 0.01}
"""


def made_up_profile(graph, device) -> Profile:
    """Made-up costs: every allowed node 4x faster on the npu, so the plan has three int8 parts."""
    cpu = {n.name: NodeCost(1.0, 1.0, MEASURED, 3.0, 5) for n in graph.nodes}
    npu = {
        n.name: NodeCost(0.25, 0.25, MEASURED, 0.75, 5) for n in graph.nodes if n.op_type in ALLOWED
    }
    bad = {n.name: f"{n.op_type} is not supported" for n in graph.nodes if n.op_type not in ALLOWED}
    entries = (
        ProcessorProfile("cpu", "ort", MEASURED, cpu, dispatch_ms=0.05),
        ProcessorProfile("npu", "ort-int8", MEASURED, npu, bad, dispatch_ms=0.05),
    )
    return Profile(graph.sha256, graph.name, device.name, graph.input_shapes(), entries)


def noisy_tail_chain(path) -> str:
    """Conv-Relu x6, then an Add of +1000 at one pixel and one of -1000 back (int8 with a range of
    +-1000 rounds every other value of the tensor away: noise, not signal), then Conv-Relu: 16
    nodes, all on the NPU's list, the noise all in the second half."""
    nodes, weights, prev = [], [], "x"
    spike = np.zeros((1, 8, 16, 16), np.float32)
    spike[0, 0, 0, 0] = 1000.0
    for k in range(7):
        if k == 6:
            nodes += [
                helper.make_node("Add", [prev, "spike"], ["up"], name="add_big"),
                helper.make_node("Add", ["up", "unspike"], ["down"], name="add_back"),
            ]
            weights += [("spike", spike), ("unspike", -spike)]
            prev = "down"
        cin = 3 if k == 0 else 8
        nodes += [
            helper.make_node(
                "Conv", [prev, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"
            ),
            helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}"),
        ]
        weights.append((f"w{k}", rand(8, cin, 3, 3, seed=20 + k)))
        prev = f"r{k}"
    onnx.save(make_model(nodes, [("x", [1, 3, 16, 16])], [(prev, [1, 8, 16, 16])], weights), path)
    return str(path)
