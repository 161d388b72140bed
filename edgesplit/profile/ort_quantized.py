"""Profile a processor that runs reduced-precision parts on ONNX Runtime (``ort-int8``, ``ort-fp16``).

The model is converted as ``compile`` converts parts (:mod:`edgesplit.precision.convert`): every
node the processor and backend support in the backend's precision, the rest left in fp32 (they
are reported unsupported: they stay on other processors). The converted model is measured under
ORT's profiler on the processor's worker thread, like :func:`~edgesplit.profile.ort.profile_ort`.

ORT fuses a QDQ model into integer kernels (``QLinearConv``, ``QLinearAdd``, ``QGemm``...) named
after the original node (``conv1_token_1`` for ``conv1``), removes activations whose range the
quantization clips (a Relu after a Conv costs nothing), and adds layout transposes. A kernel is
charged to the node it is named after; ``<tensor>_QuantizeLinear`` / ``_DequantizeLinear`` to the
node that makes (or, for a weight, first reads) the tensor, except at the model's own inputs and
outputs, which are part edges (below); anything else to the node of a neighbouring kernel.

The part edges cost too: a part quantizes what enters it and dequantizes what leaves it. Both are
measured per MB (``QuantizeLinear`` / ``DequantizeLinear`` micro-models of 4 MB) into the entry's
``edge_in_ms_per_mb`` / ``edge_out_ms_per_mb``, which the cost model charges per crossing byte,
beside the dispatch of a part (``dispatch_ms``).
"""

from __future__ import annotations

import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgesplit.cpu import configure_thread
from edgesplit.device import Backend, Processor
from edgesplit.model.calibration_data import calibration_set
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph
from edgesplit.precision.convert import calibrate, convert
from edgesplit.profile.ort import _kernel_times, _percentiles, _trivial_model, make_session, time_runs
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile
from edgesplit.throttle import busy_call

MB = 1e6
EDGE_FLOATS = 1 << 20
_SUFFIX = re.compile(r"(_token_\d+|_nchwc)$")
_QDQ = re.compile(r"^(.*)_(QuantizeLinear|DequantizeLinear)$")


def _base(name: str) -> str:
    while _SUFFIX.search(name):
        name = _SUFFIX.sub("", name)
    return name


def kernel_owners(graph: ModelGraph, optimized: onnx.GraphProto) -> dict[str, int]:
    """Optimised kernel name -> index of the original node it is charged to (see the module doc)."""
    owner: dict[int, int] = {}
    edges = {*graph.inputs, *graph.outputs}
    for k, node in enumerate(optimized.node):
        base = _base(node.name)
        m = _QDQ.match(base)
        if m and m.group(1) in edges:
            owner[k] = -1  # the model's own edges: priced per crossing byte, not as a node
        elif base in graph.index:
            owner[k] = graph.index[base]
        elif m and m.group(1) in graph.producer:
            owner[k] = graph.producer[m.group(1)]
        elif m and graph.consumers.get(m.group(1)):
            owner[k] = graph.consumers[m.group(1)][0]
    made = {t: k for k, n in enumerate(optimized.node) for t in n.output}
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(optimized.node):
        for t in n.input:
            readers.setdefault(t, []).append(k)
    changed = True
    while changed:  # layout transposes and the like: the node of a neighbouring kernel
        changed = False
        for k, n in enumerate(optimized.node):
            if k in owner:
                continue
            near = [made[t] for t in n.input if t in made] + [r for t in n.output for r in readers.get(t, ())]
            found = next((owner[j] for j in near if owner.get(j, -1) >= 0), None)
            if found is not None:
                owner[k], changed = found, True
    return {optimized.node[k].name: i for k, i in owner.items() if i >= 0}


def _edge_model(op: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """QuantizeLinear (fp32 -> uint8) or DequantizeLinear (uint8 -> fp32) of 4 MB of floats."""
    quant = op == "QuantizeLinear"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT if quant else TensorProto.UINT8, [EDGE_FLOATS])
    y = helper.make_tensor_value_info("y", TensorProto.UINT8 if quant else TensorProto.FLOAT, [EDGE_FLOATS])
    s = helper.make_tensor("s", TensorProto.FLOAT, [], [0.05])
    z = helper.make_tensor("z", TensorProto.UINT8, [], [128])
    g = helper.make_graph([helper.make_node(op, ["x", "s", "z"], ["y"])], "edge", [x], [y], [s, z])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    rng = np.random.default_rng(0)
    feed = rng.standard_normal(EDGE_FLOATS).astype(np.float32) if quant else rng.integers(0, 255, EDGE_FLOATS)
    return m, {"x": feed.astype(np.float32 if quant else np.uint8)}


def _attribute(graph: ModelGraph, optimized, kernels, warmup: int, runs: int, active_w: float):
    owners = kernel_owners(graph, optimized)
    per_node = np.zeros((len(graph.nodes), runs))
    for name, durations in kernels.items():
        i = owners.get(name)
        d = durations[warmup : warmup + runs]
        if i is not None and len(d) == runs:
            per_node[i] += np.asarray(d)
    out = {}
    for i, node in enumerate(graph.nodes):
        med, p90 = _percentiles(list(per_node[i]))
        out[node.name] = NodeCost(round(med, 6), round(p90, 6), MEASURED, round(med * active_w, 6), runs)
    return out


def profile_quantized(
    graph: ModelGraph, processor: Processor, backend: Backend, *, runs: int = 20, warmup: int = 5
) -> ProcessorProfile:
    """Measure ``graph`` converted to ``backend.precision`` on ``processor`` (see the module doc)."""
    started = time.perf_counter()
    runnable = [n.name for n in graph.nodes if processor.supports(n.op_type) and backend.supports(n.op_type)]
    unsupported = {
        n.name: f"{n.op_type} is not supported by {processor.name}/{backend.key}"
        for n in graph.nodes
        if n.name not in set(runnable)
    }
    data = calibration_set(graph)  # latency does not depend on the ranges; the planner's check does
    ranges = calibrate(graph, data) if backend.precision == "int8" else None
    model = convert(graph.model, backend.precision, ranges, runnable)
    feeds = random_inputs(graph)
    notes: list[str] = []
    with (
        ThreadPoolExecutor(
            1,
            initializer=lambda: notes.extend(
                configure_thread(processor.name, processor.cores, processor.cpu_quota_pct)
            ),
        ) as worker,
        tempfile.TemporaryDirectory(prefix="edgesplit-q-") as tmp,
    ):
        opt = str(Path(tmp) / "optimized.onnx")
        sess, psess, trivial = worker.submit(_sessions, model, processor, backend, tmp, opt).result()
        whole = time_runs(lambda: worker.submit(busy_call, sess.run, None, feeds).result(), runs, warmup)
        one = {"x": np.ones(1, np.float32)}
        dispatch = float(np.median(time_runs(lambda: worker.submit(trivial.run, None, one).result(), 30, 5)))
        edge_ms = {
            op: max(_edge_ms(worker, processor, backend, op) - dispatch, 0.0)
            for op in ("QuantizeLinear", "DequantizeLinear")
        }
        worker.submit(time_runs, lambda: psess.run(None, feeds), runs, warmup).result()
        kernels = _kernel_times(worker.submit(psess.end_profiling).result())
        optimized = onnx.load(opt, load_external_data=False).graph
    nodes = _attribute(graph, optimized, kernels, warmup, runs, processor.active_w)
    nodes = {k: v for k, v in nodes.items() if k not in unsupported}
    q_mb, dq_mb = (edge_ms[op] / (4 * EDGE_FLOATS / MB) for op in ("QuantizeLinear", "DequantizeLinear"))
    med, p90 = _percentiles(whole)
    notes.append(f"part edges: quantize {q_mb:.4f} ms/MB, dequantize {dq_mb:.4f} ms/MB")
    return ProcessorProfile(
        processor=processor.name,
        backend=backend.key,
        source=MEASURED,
        nodes=nodes,
        unsupported=unsupported,
        whole_model_ms=med if not unsupported else None,
        whole_model_p90_ms=p90 if not unsupported else None,
        elapsed_s=time.perf_counter() - started,
        note="; ".join(notes),
        dispatch_ms=round(dispatch, 6),
        edge_in_ms_per_mb=round(q_mb, 6),
        edge_out_ms_per_mb=round(dq_mb, 6),
    )


def _edge_ms(worker: ThreadPoolExecutor, processor: Processor, backend: Backend, op: str) -> float:
    """Median ms of one edge micro-model run on the worker, hand-off included."""
    model, feed = _edge_model(op)
    provider = Backend("ort", backend.provider, backend.options)
    sess = worker.submit(make_session, model, processor, provider).result()
    return float(np.median(time_runs(lambda: worker.submit(busy_call, sess.run, None, feed).result(), 10, 3)))


def _sessions(model: onnx.ModelProto, processor: Processor, backend: Backend, tmp: str, opt: str):
    cpu = Backend("ort")  # the converted model runs on ORT with the backend's provider
    provider = Backend("ort", backend.provider, backend.options)
    return (
        make_session(model, processor, provider),
        make_session(
            model,
            processor,
            provider,
            enable_profiling=True,
            profile_file_prefix=str(Path(tmp) / "trace"),
            optimized_model_filepath=opt,
        ),
        make_session(_trivial_model(), processor, cpu),
    )


class OrtQuantizedProfiler:
    """The ``ort-int8`` / ``ort-fp16`` entry of the profiler table (:func:`profile_quantized`).

    fp16 is measured only where the provider runs it natively: ORT's CPU provider runs an fp16
    model through casts to fp32, whose timings say nothing of a GPU's (predicted instead).
    """

    def unavailable(self, backend: Backend) -> str | None:
        import onnxruntime as ort

        if backend.provider not in ort.get_available_providers():
            return f"this onnxruntime has no {backend.provider}"
        if backend.precision == "fp16" and backend.provider == "CPUExecutionProvider":
            return "ORT's CPU provider runs fp16 through casts to fp32: not a measurement of fp16"
        return None

    def profile(self, graph: ModelGraph, processor: Processor, backend: Backend, options, progress=None):
        return profile_quantized(graph, processor, backend, runs=options.runs, warmup=options.warmup)
