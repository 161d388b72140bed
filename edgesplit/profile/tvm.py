"""Profile a model on Apache TVM (Relax VM, untuned), node by node.

TVM's VM reports fused function names, not ONNX nodes (DESIGN.md), so each node is extracted
as a one-node model (with the outer-scope tensors a control-flow node's subgraphs read),
imported, compiled for the processor's target and timed on the processor's worker thread (pinned
and throttled as the runtime's). Nodes with the same op, attributes and shapes share one
measurement. The whole model is compiled and timed too; where TVM cannot import it, the profile
says why.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnx

from edgesplit.cpu import configure_thread
from edgesplit.device import Backend, Processor
from edgesplit.model.extract import PartExtractor
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph, Node
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile, RunTerms
from edgesplit.profile.terms import MicroRun, MicroRunner, build_terms, neg_model
from edgesplit.throttle import busy, busy_call

Progress = Callable[[str, int, int], None]

RUNNABLE_HERE = ("llvm", "c")  # target kinds whose code runs on this CPU


@contextlib.contextmanager
def processor_worker(processor: Processor) -> Iterator[ThreadPoolExecutor]:
    """A thread set up as ``processor``'s runtime worker (pinned, throttled), to time on."""
    with ThreadPoolExecutor(
        1, initializer=lambda: configure_thread(processor.name, processor.cores, processor.cpu_quota_pct)
    ) as worker:
        yield worker


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
    cant = [n for n in graph.nodes if not backend.supports(n.op_type) or not processor.supports(n.op_type)]
    unsupported: dict[str, str] = {
        n.name: f"TVM has no {n.op_type} converter"
        if not backend.supports(n.op_type)
        else f"{n.op_type} is not supported by {processor.name}"
        for n in cant
    }
    with processor_worker(processor) as worker:
        whole_ms = whole_p90 = None
        if not cant:
            try:
                whole_ms, whole_p90 = _whole_model(graph, target, worker, runs)
                note = ""
            except Exception as e:  # noqa: BLE001 - TVM raises many types; we report the reason
                note = f"TVM cannot compile the whole model: {_first_line(e)}"
        else:
            note = f"TVM cannot run {len(cant)} nodes ({', '.join(sorted({n.op_type for n in cant}))})"
        nodes = _measure_nodes(graph, target, runs, processor, worker, unsupported, progress, label)
        terms = _terms(worker, target, max(5, runs // 2 + 2))
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
        terms=terms,
    )


def _whole_model(graph: ModelGraph, target: dict[str, Any], worker: ThreadPoolExecutor, runs: int):
    """Median and p90 of the whole model run as a one-part bundle runs it: handed to the worker,
    inputs copied in, ``main``, outputs copied out, the caller woken (as ORT's is measured)."""
    vm, dev = build_vm(graph.model, target)
    feeds = random_inputs(graph)
    arrays = [feeds[n] for n in graph.inputs]

    def run() -> None:
        raw = vm["main"](*[tvm_tensor(a, dev) for a in arrays])
        [v.numpy() for v in ([raw] if hasattr(raw, "numpy") else list(raw))]

    samples = []
    for k in range(runs + 2):
        t0 = time.perf_counter()
        worker.submit(busy_call, run).result()
        if k >= 2:
            samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples)), float(np.percentile(samples, 90))


def _measure_nodes(
    graph, target, runs, processor, worker, unsupported, progress, label
) -> dict[str, NodeCost]:
    """Every node TVM can run, compiled alone here and timed on the worker (nodes with the same
    signature share one measurement); the ones it cannot run go to ``unsupported``."""
    extractor = PartExtractor(graph)  # follows control-flow subgraphs' outer-scope reads
    protos = {p.name: p for p in graph.model.graph.node}
    cache: dict[str, NodeCost | str] = {}
    nodes: dict[str, NodeCost] = {}
    todo = [n for n in graph.nodes if n.name not in unsupported]
    rng = np.random.default_rng(0)
    for k, node in enumerate(todo):
        sig = _signature(node, protos[node.name], graph)
        if sig not in cache:
            cache[sig] = _measure_node(graph, node, extractor, target, runs, rng, processor, worker)
        got = cache[sig]
        if isinstance(got, str):
            unsupported[node.name] = got
        else:
            nodes[node.name] = got
        if progress is not None:
            progress(label, k + 1, len(todo))
    return nodes


def _terms(worker: ThreadPoolExecutor, target: dict[str, Any], repeats: int) -> RunTerms | None:
    """The part terms of this pair (:mod:`edgesplit.profile.terms`; TVM adds no layout reorders
    at part boundaries: a library takes and returns plain tensors); None where TVM cannot build
    the micro-models."""
    run = tvm_micro_runner(worker, target, runs=repeats + 2)
    trivial = build_vm(neg_model(1), target)
    one = [np.ones(1, np.float32)]

    def call():
        vm, dev = trivial
        return busy_call(lambda: vm["main"](*[tvm_tensor(a, dev) for a in one]).numpy())

    try:
        return build_terms(run, worker, call, reorders=False, repeats=repeats)
    except Exception:  # noqa: BLE001 - TVM raises many types; the entry is still usable without terms
        return None


def tvm_tensor(a: np.ndarray, dev):
    import tvm

    return tvm.runtime.tensor(np.ascontiguousarray(a), dev)


def tvm_micro_runner(
    worker: ThreadPoolExecutor, target: dict[str, Any], runs: int = 15, warmup: int = 3
) -> MicroRunner:
    """Runs a micro-model as the runtime's TVM executor runs a part (inputs copied into TVM
    tensors, ``main``, outputs copied out, merged), on ``worker``; its kernels are TVM's own time
    evaluator (no Python around them)."""

    def on_worker(vm, dev, arrays: list[np.ndarray]):
        lock, merged = threading.Lock(), {}

        def path() -> float:
            t0 = time.perf_counter_ns()
            with busy():
                args = [tvm_tensor(a, dev) for a in arrays]
                raw = vm["main"](*args)
                outs = [v.numpy() for v in ([raw] if hasattr(raw, "numpy") else list(raw))]
                with lock:
                    merged["y"] = outs
            return (time.perf_counter_ns() - t0) / 1e6

        times = [path() for _ in range(warmup + runs)][warmup:]
        kernels = busy_call(time_vm, vm, dev, arrays, runs)
        return float(np.median(times)), float(np.median(kernels))

    def run(model: onnx.ModelProto, feeds) -> MicroRun:
        vm, dev = build_vm(model, target)
        arrays = [feeds[i.name] for i in model.graph.input]
        path_ms, kernels_ms = worker.submit(on_worker, vm, dev, arrays).result()
        return MicroRun(path_ms, kernels_ms)

    return run


def _measure_node(
    graph: ModelGraph,
    node: Node,
    extractor,
    target,
    runs: int,
    rng: np.random.Generator,
    processor: Processor,
    worker: ThreadPoolExecutor,
) -> NodeCost | str:
    from edgesplit.model.feeds import random_tensor

    acts = [t for t in dict.fromkeys(node.inputs) if not graph.tensors[t].is_weight]
    try:
        sub = extractor.extract(acts, list(node.outputs), node.name)
        vm, dev = build_vm(sub, target)  # compiled here, timed on the processor's worker
        arrays = [
            graph.sample_inputs[t] if t in graph.sample_inputs else random_tensor(graph.tensors[t], rng)
            for t in acts
        ]
        samples = worker.submit(busy_call, time_vm, vm, dev, arrays, runs).result()
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
