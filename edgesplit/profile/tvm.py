"""Profile a model on Apache TVM (Relax VM, untuned), node by node.

TVM's VM reports fused function names, not ONNX nodes (DESIGN.md), so each node is extracted
as a one-node model (with the outer-scope tensors a control-flow node's subgraphs read),
imported, compiled for the processor's target and timed. Nodes with the same op, attributes and
shapes share one measurement. The whole model is compiled and timed too; where TVM cannot import
it, the profile says why.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from edgesplit.device import Backend, Processor
from edgesplit.model.extract import PartExtractor
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph, Node
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile

Progress = Callable[[str, int, int], None]

RUNNABLE_HERE = ("llvm", "c")  # target kinds whose code runs on this CPU


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:200]


def build_vm(model: onnx.ModelProto, target: dict[str, Any]):
    """Import an ONNX model into Relax, compile it for ``target`` and return (vm, device)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        mod = from_onnx(model, keep_params_in_input=False)
        ex = tvm.compile(mod, target=tvm.target.Target(dict(target)))
    dev = tvm.cpu()
    return relax.VirtualMachine(ex, dev), dev


def time_vm(vm, dev, arrays: list[np.ndarray], runs: int) -> list[float]:
    """Per-run latencies in ms of ``vm['main']`` (TVM's own time evaluator)."""
    import tvm

    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    vm["main"](*args)  # warm-up, and to size the repeat count
    t0 = time.perf_counter()
    vm["main"](*args)
    once_s = time.perf_counter() - t0
    repeat = max(3, min(runs, int(2.0 / max(once_s, 1e-6))))
    res = vm.time_evaluator("main", dev, number=1, repeat=repeat)(*args)
    return [r * 1e3 for r in res.results]


def _signature(node: Node, proto: onnx.NodeProto, graph: ModelGraph) -> str:
    attrs = b"".join(a.SerializeToString() for a in proto.attribute)
    ins = ";".join(
        f"{graph.tensors[t].shape}{graph.tensors[t].dtype}{'w' if graph.tensors[t].is_weight else ''}"
        for t in node.inputs
    )
    return f"{node.op_type}|{attrs.hex()}|{ins}"


def profile_tvm(
    graph: ModelGraph,
    processor: Processor,
    backend: Backend,
    *,
    runs: int = 10,
    progress: Progress | None = None,
) -> ProcessorProfile:
    """Measure every node TVM can import on ``backend.target`` (run here, so llvm only)."""
    started = time.perf_counter()
    target = dict(backend.target or {"kind": "llvm"})
    label = f"{processor.name}/tvm"
    if target.get("kind") not in RUNNABLE_HERE or target.get("mtriple", "x86_64").split("-")[0] not in (
        "x86_64",
        __import__("platform").machine(),
    ):
        return ProcessorProfile(
            processor.name,
            backend.key,
            MEASURED,
            {},
            {},
            note=f"target {target} does not run on this machine",
        )
    unsupported: dict[str, str] = {}
    nodes: dict[str, NodeCost] = {}
    note = ""
    whole_ms = whole_p90 = None
    cant = [n for n in graph.nodes if not backend.supports(n.op_type) or not processor.supports(n.op_type)]
    for n in cant:
        unsupported[n.name] = (
            f"TVM has no {n.op_type} converter"
            if not backend.supports(n.op_type)
            else (f"{n.op_type} is not supported by {processor.name}")
        )
    if not cant:
        try:
            vm, dev = build_vm(graph.model, target)
            feeds = random_inputs(graph)
            samples = time_vm(vm, dev, [feeds[n] for n in graph.inputs], runs)
            whole_ms, whole_p90 = float(np.median(samples)), float(np.percentile(samples, 90))
        except Exception as e:  # noqa: BLE001 - TVM raises many types; we report the reason
            note = f"TVM cannot compile the whole model: {_first_line(e)}"
    else:
        note = f"TVM cannot run {len(cant)} nodes ({', '.join(sorted({n.op_type for n in cant}))})"

    extractor = PartExtractor(graph)  # follows control-flow subgraphs' outer-scope reads
    protos = {p.name: p for p in graph.model.graph.node}
    cache: dict[str, NodeCost | str] = {}
    todo = [n for n in graph.nodes if n.name not in unsupported]
    rng = np.random.default_rng(0)
    for k, node in enumerate(todo):
        sig = _signature(node, protos[node.name], graph)
        if sig not in cache:
            cache[sig] = _measure_node(graph, node, extractor, target, runs, rng, processor)
        got = cache[sig]
        if isinstance(got, str):
            unsupported[node.name] = got
        else:
            nodes[node.name] = got
        if progress is not None:
            progress(label, k + 1, len(todo))
    return ProcessorProfile(
        processor.name,
        backend.key,
        MEASURED,
        nodes,
        unsupported,
        whole_model_ms=whole_ms,
        whole_model_p90_ms=whole_p90,
        note=note,
        elapsed_s=time.perf_counter() - started,
    )


def _measure_node(
    graph: ModelGraph,
    node: Node,
    extractor,
    target,
    runs: int,
    rng: np.random.Generator,
    processor: Processor,
) -> NodeCost | str:
    from edgesplit.model.feeds import random_tensor

    acts = [t for t in dict.fromkeys(node.inputs) if not graph.tensors[t].is_weight]
    try:
        sub = extractor.extract(acts, list(node.outputs), node.name)
        vm, dev = build_vm(sub, target)
        arrays = [
            graph.sample_inputs[t] if t in graph.sample_inputs else random_tensor(graph.tensors[t], rng)
            for t in acts
        ]
        samples = time_vm(vm, dev, arrays, runs)
    except Exception as e:  # noqa: BLE001
        return f"TVM cannot import or compile {node.op_type}: {_first_line(e)}"
    med, p90 = float(np.median(samples)), float(np.percentile(samples, 90))
    return NodeCost(round(med, 6), round(p90, 6), MEASURED, round(med * processor.active_w, 6), len(samples))


class TvmProfiler:
    """The ``tvm`` entry of the profiler table: one node at a time on the Relax VM (:func:`profile_tvm`).

    Each node is compiled, so it takes half the timed runs of ORT (at least 3).
    """

    def unavailable(self, backend: Backend) -> str | None:
        kind = (backend.target or {}).get("kind")
        return None if kind in RUNNABLE_HERE else f"TVM target kind '{kind}' does not run here"

    def profile(
        self, graph: ModelGraph, processor: Processor, backend: Backend, options, progress: Progress | None
    ) -> ProcessorProfile:
        return profile_tvm(graph, processor, backend, runs=max(3, options.runs // 2), progress=progress)
