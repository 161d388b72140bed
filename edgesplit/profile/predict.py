"""Predicted costs from a roofline model of a processor, for processors not present here.

latency = launch overhead + max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)).
The efficiencies per op class are what well-tuned mobile kernels reach in published
measurements (e.g. nn-Meter, MobiSys 2021, Fig. 3; MLPerf Mobile): dense convolutions and
GEMMs reach a good share of peak, depthwise convolutions and elementwise ops are memory bound.
"""

from __future__ import annotations

import time

from edgesplit.device import Backend, Processor
from edgesplit.model.graph import ModelGraph, Node
from edgesplit.profile.store import PREDICTED, NodeCost, ProcessorProfile

# Share of peak FLOPs reached, by op type and processor kind.
_COMPUTE_EFFICIENCY = {
    "cpu": {"Conv": 0.55, "ConvTranspose": 0.4, "Gemm": 0.6, "MatMul": 0.6, "LSTM": 0.3, "GRU": 0.3},
    "gpu": {"Conv": 0.45, "ConvTranspose": 0.3, "Gemm": 0.55, "MatMul": 0.5, "LSTM": 0.1, "GRU": 0.1},
    "npu": {"Conv": 0.6, "ConvTranspose": 0.4, "Gemm": 0.5, "MatMul": 0.5},
    "dsp": {"Conv": 0.5, "Gemm": 0.4, "MatMul": 0.4},
}
_DEFAULT_COMPUTE = 0.25
_MEMORY_EFFICIENCY = 0.6


def _depthwise(node: Node, graph: ModelGraph | None) -> bool:
    if node.op_type != "Conv" or graph is None or len(node.inputs) < 2:
        return False
    w = graph.tensors[node.inputs[1]].shape
    return len(w) >= 2 and w[1] == 1


def roofline_ms(node: Node, processor: Processor, graph: ModelGraph | None = None) -> float:
    """Predicted latency of ``node`` on ``processor`` in ms."""
    eff = _COMPUTE_EFFICIENCY.get(processor.kind, {}).get(node.op_type, _DEFAULT_COMPUTE)
    if _depthwise(node, graph):
        eff = 0.1
    compute_ms = node.flops / (processor.peak_gflops * 1e9 * eff) * 1e3
    memory_ms = (
        (node.bytes_read + node.bytes_written)
        / (processor.mem_bandwidth_gbps * 1e9 * _MEMORY_EFFICIENCY)
        * 1e3
    )
    return processor.launch_overhead_ms + max(compute_ms, memory_ms)


def predict(graph: ModelGraph, processor: Processor, backend: Backend) -> ProcessorProfile:
    """Roofline costs for every node the processor and backend support."""
    started = time.perf_counter()
    nodes: dict[str, NodeCost] = {}
    unsupported: dict[str, str] = {}
    for node in graph.nodes:
        dtypes = tuple(
            dict.fromkeys(
                graph.tensors[t].dtype
                for t in node.inputs
                if t in graph.tensors and not graph.tensors[t].is_weight
            )
        )
        if not processor.supports(node.op_type, dtypes):
            unsupported[node.name] = f"{node.op_type} is not supported by {processor.name}"
            continue
        if not backend.supports(node.op_type):
            unsupported[node.name] = f"{node.op_type} is not supported by {processor.name}/{backend.key}"
            continue
        ms = roofline_ms(node, processor, graph)
        nodes[node.name] = NodeCost(
            round(ms, 6), round(ms, 6), PREDICTED, round(ms * processor.active_w, 6), 0
        )
    whole = sum(c.latency_ms for c in nodes.values()) if not unsupported else None
    return ProcessorProfile(
        processor.name,
        backend.key,
        PREDICTED,
        nodes,
        unsupported,
        whole_model_ms=whole,
        whole_model_p90_ms=whole,
        elapsed_s=time.perf_counter() - started,
    )
