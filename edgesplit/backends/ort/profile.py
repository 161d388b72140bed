"""Profile a model on ONNX Runtime with ORT's own per-kernel profiler.

ORT rewrites the graph before it runs it (fusions such as Conv+Relu, NCHWc layouts with inserted
reorders), so the profiler's kernels are not the model's nodes. We save the optimised graph from
the same session, group its nodes into regions joined by tensors the original model does not have,
and map each region back to the original nodes between its inputs and outputs. A region's time
is shared among the nodes it covers in proportion to their roofline cost.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from edgesplit.backends.ort.graph import blocked_layout, map_regions
from edgesplit.backends.ort.run import (
    make_session,
    micro_runner,
    ort_contention,
    processor_worker,
    whole_model_timer,
)
from edgesplit.device.spec import Backend, Processor
from edgesplit.device.throttle import busy_call
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph
from edgesplit.profile.predict import roofline_ms
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile
from edgesplit.profile.terms import CONTENTION_S_PER_RUN, build_terms
from edgesplit.util import Progress

if TYPE_CHECKING:
    from edgesplit.profile.backends import ProfileTask

__all__ = ["OrtProfiler", "make_session", "map_regions", "profile_ort", "time_runs"]


def _percentiles(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(np.median(arr)), float(np.percentile(arr, 90))


def _measured(
    processor: Processor,
    backend: Backend,
    nodes: dict[str, NodeCost],
    whole: list[float] | None,
    started: float,
    notes: list[str],
    **more: object,
) -> ProcessorProfile:
    """A measured entry: ``nodes``, the median and p90 of the whole model's timed runs ``whole``
    (None: the whole model does not run), the time since ``started`` and the ``notes``."""
    med, p90 = _percentiles(whole) if whole is not None else (None, None)
    return ProcessorProfile(
        processor=processor.name,
        backend=backend.key,
        source=MEASURED,
        nodes=nodes,
        whole_model_ms=med,
        whole_model_p90_ms=p90,
        elapsed_s=time.perf_counter() - started,
        note="; ".join(notes),
        **more,
    )


def time_runs(fn: Callable[[], object], runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


def _kernel_times(trace_path: str) -> dict[str, list[float]]:
    """Per-kernel durations in ms, in run order, from ORT's Chrome-trace profile.

    ORT reports the kernels of If, Loop and Scan subgraphs as events of their own, nested in
    time inside the control-flow node's event, whose duration already covers them: they are
    left out, so a subgraph's time counts once, for its control-flow node.
    """
    events = json.loads(Path(trace_path).read_text())
    kernels = [
        ev
        for ev in events
        if ev.get("cat") == "Node" and str(ev.get("name", "")).endswith("_kernel_time")
    ]
    spans: dict[object, list[tuple[float, float]]] = {}
    for ev in kernels:
        if ev.get("args", {}).get("op_name") in CONTROL_FLOW_OPS:
            spans.setdefault(ev.get("tid"), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    merged = {tid: _merge(v) for tid, v in spans.items()}
    times: dict[str, list[float]] = {}
    for ev in kernels:
        start, end = ev["ts"], ev["ts"] + ev["dur"]
        outer = merged.get(ev.get("tid"))
        if outer:
            k = bisect.bisect_right(outer[0], start) - 1
            if k >= 0 and end <= outer[1][k] and (start, end) != (outer[0][k], outer[1][k]):
                continue  # a kernel inside a control-flow node's subgraph
        times.setdefault(ev["name"][: -len("_kernel_time")], []).append(ev["dur"] / 1e3)
    return times


def _merge(spans: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Disjoint (starts, ends) covering the spans: nested control flow lies inside its parent."""
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(spans):
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


def profile_ort(
    graph: ModelGraph,
    processor: Processor,
    backend: Backend,
    *,
    runs: int = 20,
    warmup: int = 5,
    progress: Progress | None = None,
    session_attrs: Mapping[str, object] | None = None,
) -> ProcessorProfile:
    """Measure every node of ``graph`` on ORT with ``backend``'s execution provider.

    Returns per-node median and p90 over ``runs`` timed runs after ``warmup`` runs, and the
    whole-model latency measured without the profiler. ``session_attrs`` are ``SessionOptions``
    attributes set on every session (a backend that runs ORT differently, say unoptimised).
    """
    attrs = dict(session_attrs or {})
    started = time.perf_counter()
    feeds = random_inputs(graph)
    unsupported = {
        n.name: f"{n.op_type} not supported by {processor.name}"
        for n in graph.nodes
        if not processor.supports(n.op_type)
    }
    if unsupported:
        note = "some ops are not supported; measured per part only"
        return ProcessorProfile(processor.name, backend.key, MEASURED, {}, unsupported, note=note)
    total = runs * 2 + warmup * 2
    tick = _ticker(progress, f"{processor.name}/ort", total)
    with processor_worker(processor, "edgesplit-ort-") as (worker, tmp, notes):
        opt_path = os.path.join(tmp, "optimized.onnx")
        sess, trivial, psess = worker.submit(
            _sessions, graph, processor, backend, attrs, tmp, opt_path
        ).result()
        # One phase after the other, not alternating: an idle ORT session's threads spin for a
        # while after each run and would slow the other session down.
        whole = time_runs(
            lambda: (worker.submit(busy_call, sess.run, None, feeds).result(), tick()), runs, warmup
        )
        one = {"x": np.ones(1, np.float32)}
        dispatch = float(
            np.median(
                time_runs(lambda: worker.submit(busy_call, trivial.run, None, one).result(), 30, 5)
            )
        )
        worker.submit(
            time_runs, lambda: (busy_call(psess.run, None, feeds), tick()), runs, warmup
        ).result()
        kernels = _kernel_times(worker.submit(psess.end_profiling).result())
        optimized = onnx.load(opt_path, load_external_data=False).graph
        run = micro_runner(worker, processor, backend, attrs, tmp, runs=max(5, runs // 2 + 3))
        trivial_call = lambda: busy_call(trivial.run, None, one)  # noqa: E731
        blocked = blocked_layout(graph, optimized)
        shapes = {
            t: graph.tensors[t].shape for t in blocked[0] if graph.tensors[t].dtype == "float32"
        }
        terms = build_terms(
            run,
            worker,
            trivial_call,
            blocked=blocked,
            blocked_shapes=shapes,
            repeats=max(5, runs // 2 + 2),
        )
    nodes = _attribute(graph, processor, optimized, kernels, warmup, runs)
    return _measured(
        processor,
        backend,
        nodes,
        whole,
        started,
        notes,
        dispatch_ms=round(dispatch, 6),
        terms=terms,
    )


def _sessions(
    graph: ModelGraph, processor: Processor, backend: Backend, attrs: dict, tmp: str, opt_path: str
):
    """The whole model; a trivial model (what a part costs to dispatch); the whole model under ORT's
    profiler, which also saves the graph ORT optimised (to map its kernels back to our nodes)."""
    return (
        make_session(graph.model, processor, backend, **attrs),
        make_session(_trivial_model(), processor, backend, **attrs),
        make_session(
            graph.model,
            processor,
            backend,
            **attrs,
            enable_profiling=True,
            profile_file_prefix=os.path.join(tmp, "trace"),
            optimized_model_filepath=opt_path,
        ),
    )


def _trivial_model() -> onnx.ModelProto:
    """One Neg on one float: what a part costs to dispatch, almost without compute."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    m = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("Neg", ["x"], ["y"])], "t", [x], [y]),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )
    m.ir_version = 8
    return m


def _attribute(
    graph: ModelGraph,
    processor: Processor,
    optimized: onnx.GraphProto,
    kernels: dict[str, list[float]],
    warmup: int,
    runs: int,
) -> dict[str, NodeCost]:
    share: dict[int, np.ndarray] = {}
    for names, covered in map_regions(graph, optimized):
        per_run = np.zeros(runs)
        for name in names:
            d = kernels.get(name, [])[warmup:]
            if len(d) >= runs:
                per_run += np.asarray(d[:runs])
            elif d:  # a kernel that ran a different number of times (control flow): spread it
                per_run += float(np.sum(d)) / runs
        if not covered:
            continue
        weights = np.array([roofline_ms(graph.nodes[i], processor) for i in covered]) + 1e-9
        weights /= weights.sum()
        for i, w in zip(covered, weights):
            share[i] = share.get(i, np.zeros(runs)) + per_run * w
    out = {}
    for i, node in enumerate(graph.nodes):
        samples = share.get(i, np.zeros(runs))
        med, p90 = float(np.median(samples)), float(np.percentile(samples, 90))
        energy = med * processor.active_w  # W * ms = mJ; modelled (no power rails here)
        out[node.name] = NodeCost(round(med, 6), round(p90, 6), MEASURED, round(energy, 6), runs)
    return out


def _ticker(progress: Progress | None, label: str, total: int) -> Callable[[], None]:
    count = [0]

    def tick() -> None:
        count[0] += 1
        if progress is not None:
            progress(label, count[0], total)

    return tick


def provider_missing(backend: Backend) -> str | None:
    """Why this onnxruntime cannot run ``backend`` (its execution provider is absent), or None."""
    import onnxruntime as ort

    if backend.provider not in ort.get_available_providers():
        return f"this onnxruntime has no {backend.provider}"
    return None


class OrtProfiler:
    """The ``ort`` entry of the profiler table: ORT's own per-kernel profiler (:func:`profile_ort`).

    ``session_attrs`` are ``SessionOptions`` attributes for every session it makes, so that a
    backend running ORT with other settings is one more entry of this class.
    """

    def __init__(self, **session_attrs: object):
        self.session_attrs = session_attrs

    def unavailable(self, backend: Backend) -> str | None:
        return provider_missing(backend)

    def profile(self, task: ProfileTask) -> ProcessorProfile:
        return profile_ort(
            task.graph,
            task.processor,
            task.backend,
            runs=task.options.runs,
            warmup=task.options.warmup,
            progress=task.progress,
            session_attrs=self.session_attrs,
        )

    def whole_model_timer(self, graph: ModelGraph, processor: Processor, backend: Backend):
        """A context manager giving a timer of one whole-model run (ms), as :func:`profile_ort`
        times it (for :func:`~edgesplit.profile.level.level`)."""
        return whole_model_timer(graph, processor, backend, self.session_attrs)

    def contention(
        self, task: ProfileTask, others: list[tuple[Processor, Backend]]
    ) -> dict[str, float]:
        """The task's pair's slowdown while each of ``others`` runs the whole model
        (:func:`ort_contention`)."""
        runs = task.options.runs
        rounds, min_s = max(2, min(4, runs // 5)), CONTENTION_S_PER_RUN * runs
        return ort_contention(
            task.graph, task.processor, task.backend, others, self.session_attrs, rounds, min_s
        )
