"""Profile a processor that runs reduced-precision parts on ONNX Runtime (``ort-int8``,
``ort-fp16``).

The model is converted as ``compile`` converts parts (:mod:`edgesplit.precision.convert`): every
node the processor and backend support in the backend's precision, the rest left in fp32 (they
are reported unsupported: they stay on other processors). The converted model is measured under
ORT's profiler on the processor's worker thread, like
:func:`~edgesplit.backends.ort.profile.profile_ort`.

ORT fuses a QDQ model into integer kernels (``QLinearConv``, ``QLinearAdd``, ``QGemm``...) named
after the original node (``conv1_token_1`` for ``conv1``), removes activations whose range the
quantization clips (a Relu after a Conv costs nothing), and adds layout transposes. A kernel is
charged to the node it is named after; ``<tensor>_QuantizeLinear`` / ``_DequantizeLinear`` to the
node that makes (or, for a weight, first reads) the tensor, except at the model's own inputs and
outputs, which are part edges (below); anything else to the node of a neighbouring kernel.

The part edges cost too: a part quantizes what enters it and dequantizes what leaves it, and ORT's
integer convolution runs channels-last, so each edge also transposes the layout. Both sides are
measured on a micro-part as compile makes one (:func:`edge_model`: a QDQ 1x1 ``Conv`` whose float32
input and output cross, 4.9 MB each; ``QuantizeLinear`` and ``Transpose`` in, ``Transpose`` and
``DequantizeLinear`` out) into the entry's ``edge_in_ms_per_mb`` / ``edge_out_ms_per_mb``, which
the cost model charges per crossing byte, beside the dispatch of a part (``dispatch_ms``). The
per-MB cost grows with the tensor (0.12-0.23 ms/MB a side from 3.7 to 9.8 MB here); 4.9 MB is the
size of a text detector's neck tensors at 640 x 640. Measured alone, ``QuantizeLinear`` and
``DequantizeLinear`` left the transposes out, and PP-OCRv4 det's int8 parts paid about twice the
edge cost they were priced at.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgesplit.backends.ort.profile import (
    _kernel_times,
    _measured,
    _percentiles,
    _trivial_model,
    make_session,
    provider_missing,
    time_runs,
)
from edgesplit.backends.ort.run import processor_worker
from edgesplit.device.spec import Backend, Processor
from edgesplit.device.throttle import busy_call
from edgesplit.model.calibration_data import calibration_set
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph
from edgesplit.precision.convert import calibrate, convert
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile

if TYPE_CHECKING:
    from edgesplit.profile.backends import ProfileTask

MB = 1e6
EDGE_CHANNELS, EDGE_SIDE = 48, 160  # 4.9 MB of float32 at each edge, shaped like a detector neck
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
            near = [made[t] for t in n.input if t in made] + [
                r for t in n.output for r in readers.get(t, ())
            ]
            found = next((owner[j] for j in near if owner.get(j, -1) >= 0), None)
            if found is not None:
                owner[k], changed = found, True
    return {optimized.node[k].name: i for k, i in owner.items() if i >= 0}


def edge_model(channels: int = EDGE_CHANNELS, side: int = EDGE_SIDE) -> onnx.ModelProto:
    """An int8 part as compile makes one: a 1x1 ``Conv`` in QDQ form (per-channel int8 weights,
    uint8 activations) whose float32 input and output are part edges. ORT runs it as
    ``QuantizeLinear -> Transpose -> QLinearConv -> Transpose -> DequantizeLinear``: its integer
    convolution is channels-last, so each edge is a (de)quantization *and* a layout transpose."""
    shape = [1, channels, side, side]
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (channels, channels, 1, 1)).astype(np.int8)
    inits = [
        helper.make_tensor("w_q", TensorProto.INT8, w.shape, w.tobytes(), raw=True),
        helper.make_tensor("w_s", TensorProto.FLOAT, [channels], [0.01] * channels),
        helper.make_tensor("w_z", TensorProto.INT8, [channels], [0] * channels),
        helper.make_tensor("a_s", TensorProto.FLOAT, [], [0.05]),
        helper.make_tensor("a_z", TensorProto.UINT8, [], [128]),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "a_s", "a_z"], ["x_q"], name="x_QuantizeLinear"),
        helper.make_node(
            "DequantizeLinear", ["x_q", "a_s", "a_z"], ["x_dq"], name="x_DequantizeLinear"
        ),
        helper.make_node(
            "DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0, name="w_DequantizeLinear"
        ),
        helper.make_node("Conv", ["x_dq", "w"], ["c"], name="conv"),
        helper.make_node("QuantizeLinear", ["c", "a_s", "a_z"], ["c_q"], name="c_QuantizeLinear"),
        helper.make_node(
            "DequantizeLinear", ["c_q", "a_s", "a_z"], ["y"], name="y_DequantizeLinear"
        ),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    m = helper.make_model(
        helper.make_graph(nodes, "edges", [x], [y], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    m.ir_version = 8
    return m


def edge_sides(optimized: onnx.GraphProto) -> tuple[list[str], list[str]]:
    """The kernels of an optimised :func:`edge_model` before its convolution (the part's way in)
    and after it (the way out), by name; the convolution is the node named after ``conv``."""
    names = [n.name for n in optimized.node]
    k = next(i for i, n in enumerate(names) if _base(n) == "conv")
    return names[:k], names[k + 1 :]


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
        out[node.name] = NodeCost(
            round(med, 6), round(p90, 6), MEASURED, round(med * active_w, 6), runs
        )
    return out


def profile_quantized(
    graph: ModelGraph, processor: Processor, backend: Backend, *, runs: int = 20, warmup: int = 5
) -> ProcessorProfile:
    """Measure ``graph`` converted to ``backend.precision`` on ``processor`` (see the module
    doc)."""
    started = time.perf_counter()
    runnable = [
        n.name for n in graph.nodes if processor.supports(n.op_type) and backend.supports(n.op_type)
    ]
    unsupported = {
        n.name: f"{n.op_type} is not supported by {processor.name}/{backend.key}"
        for n in graph.nodes
        if n.name not in set(runnable)
    }
    data = calibration_set(graph)  # latency does not depend on the ranges; the planner's check does
    ranges = calibrate(graph, data) if backend.precision == "int8" else None
    model = convert(graph.model, backend.precision, ranges, runnable)
    feeds = random_inputs(graph)
    with processor_worker(processor, "edgesplit-q-") as (worker, tmp, notes):
        opt = str(Path(tmp) / "optimized.onnx")
        sess, psess, trivial = worker.submit(
            _sessions, model, processor, backend, tmp, opt
        ).result()
        whole = time_runs(
            lambda: worker.submit(busy_call, sess.run, None, feeds).result(), runs, warmup
        )
        one = {"x": np.ones(1, np.float32)}
        dispatch = float(
            np.median(time_runs(lambda: worker.submit(trivial.run, None, one).result(), 30, 5))
        )
        edge_in, edge_out, edge_ops = _edge_costs(worker, processor, backend, tmp, runs, warmup)
        worker.submit(time_runs, lambda: psess.run(None, feeds), runs, warmup).result()
        kernels = _kernel_times(worker.submit(psess.end_profiling).result())
        optimized = onnx.load(opt, load_external_data=False).graph
    nodes = _attribute(graph, optimized, kernels, warmup, runs, processor.active_w)
    nodes = {k: v for k, v in nodes.items() if k not in unsupported}
    notes.append(
        f"part edges: in ({edge_ops[0]}) {edge_in:.4f} ms/MB, out ({edge_ops[1]}) {edge_out:.4f} "
        "ms/MB"
    )
    return _measured(
        processor,
        backend,
        nodes,
        None if unsupported else whole,
        started,
        notes,
        unsupported=unsupported,
        dispatch_ms=round(dispatch, 6),
        edge_in_ms_per_mb=round(edge_in, 6),
        edge_out_ms_per_mb=round(edge_out, 6),
    )


def _edge_costs(
    worker: ThreadPoolExecutor,
    processor: Processor,
    backend: Backend,
    tmp: str,
    runs: int,
    warmup: int,
) -> tuple[float, float, tuple[str, str]]:
    """(ms per MB in, ms per MB out, the op types of each side) of an int8 part's edges: the kernels
    on either side of :func:`edge_model`'s convolution under ORT's profiler, per MB of the float32
    tensor that crosses (medians over the runs)."""
    model = edge_model()
    provider = Backend("ort", backend.provider, backend.options)
    opt = str(Path(tmp) / "edges.optimized.onnx")
    extra = {"enable_profiling": True, "profile_file_prefix": str(Path(tmp) / "edges")}
    sess = worker.submit(
        make_session, model, processor, provider, **extra, optimized_model_filepath=opt
    ).result()
    feed = {
        "x": np.random.default_rng(0)
        .standard_normal(EDGE_CHANNELS * EDGE_SIDE**2)
        .astype(np.float32)
    }
    feed["x"] = feed["x"].reshape(1, EDGE_CHANNELS, EDGE_SIDE, EDGE_SIDE)
    worker.submit(time_runs, lambda: busy_call(sess.run, None, feed), runs, warmup).result()
    kernels = _kernel_times(worker.submit(sess.end_profiling).result())
    optimized = onnx.load(opt, load_external_data=False).graph
    ops = {n.name: n.op_type for n in optimized.node}
    mb = 4 * EDGE_CHANNELS * EDGE_SIDE**2 / MB

    def side(names: list[str]) -> float:
        per_run = np.sum(
            [kernels[n][warmup : warmup + runs] for n in names if n in kernels], axis=0
        )
        return float(np.median(per_run)) / mb if np.size(per_run) else 0.0

    into, out_of = edge_sides(optimized)
    return (
        side(into),
        side(out_of),
        (", ".join(ops[n] for n in into), ", ".join(ops[n] for n in out_of)),
    )


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
        if missing := provider_missing(backend):
            return missing
        if backend.precision == "fp16" and backend.provider == "CPUExecutionProvider":
            return "ORT's CPU provider runs fp16 through casts to fp32: not a measurement of fp16"
        return None

    def profile(self, task: ProfileTask) -> ProcessorProfile:
        runs, warmup = task.options.runs, task.options.warmup
        return profile_quantized(task.graph, task.processor, task.backend, runs=runs, warmup=warmup)
