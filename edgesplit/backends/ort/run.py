"""ORT on a processor's worker: its sessions, and the ORT side of the part terms
(:mod:`edgesplit.profile.terms`): micro-models run as the runtime runs a part, their kernels read
from ORT's own profiler, and contention between processors."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx

from edgesplit.device.cpu import configure_as, ort_session_options
from edgesplit.device.spec import Backend, Processor
from edgesplit.device.throttle import busy, busy_call
from edgesplit.limits import StoppableSession
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph
from edgesplit.profile.terms import (
    CONTENTION_MIN_S,
    BackgroundLoad,
    MicroRun,
    MicroRunner,
    contention_factor,
)


def make_session(
    model: onnx.ModelProto | bytes | str, processor: Processor, backend: Backend, **extra
):
    import onnxruntime as ort

    # a core group's threads stop spinning when a run ends: they sit on its members' cores, whose
    # own work (timed next, or in the same rounds) would otherwise lose the core to them (the
    # little core's whole model measured 2x slower beside an idle group's session)
    throttled = bool(processor.cpu_quota_pct) or bool(processor.core_quotas)
    so = ort_session_options(
        processor.threads,
        processor.cores,
        spin=not processor.is_group,
        throttled=throttled,
        **extra,
    )
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    providers = [(backend.provider, dict(backend.options))]
    if backend.provider != "CPUExecutionProvider":
        providers.append(("CPUExecutionProvider", {}))
    return StoppableSession(
        ort.InferenceSession(data, so, providers=providers)
    )  # stops at the stage's deadline


class _RunKernels(NamedTuple):
    """One ``model_run`` of ORT's profile: kernels without reorders, the reorders, and the reorders
    by direction and NCHW shape (``("in", (1, 64, 28, 28)) -> ms``: into the blocked layout)."""

    kernels_ms: float
    reorder_ms: float
    reorder_nbytes: int
    by_shape: dict[tuple[str, tuple[int, ...]], float]


def _reorder_key(args: Mapping) -> tuple[str, tuple[int, ...]] | None:
    """``ReorderInput`` reads an NCHW tensor, ``ReorderOutput`` writes one: that shape names it."""
    into = args.get("op_name") == "ReorderInput"
    shapes = args.get("input_type_shape" if into else "output_type_shape") or [{}]
    dims = next(iter(shapes[0].values()), None) if isinstance(shapes[0], dict) else None
    if not isinstance(dims, list):
        return None
    return ("in" if into else "out", tuple(int(d) for d in dims))


def _run_kernels(trace_path: str) -> list[_RunKernels]:
    """Per ``model_run`` of ORT's profile, its kernels (see :class:`_RunKernels`)."""
    events = json.loads(Path(trace_path).read_text())
    runs = sorted(
        (e["ts"], e["dur"])
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    nodes = sorted(
        (
            (e["ts"], e["dur"], (e.get("args") or {}))
            for e in events
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
        ),
        key=lambda n: n[0],
    )
    out, k = [], 0
    for ts, dur in runs:
        kern = reo = 0.0
        nbytes = 0
        by_shape: dict[tuple[str, tuple[int, ...]], float] = {}
        while k < len(nodes) and nodes[k][0] < ts + dur:
            start, ms, args = nodes[k][0], nodes[k][1] / 1e3, nodes[k][2]
            k += 1
            if start < ts:
                continue
            if not str(args.get("op_name", "")).startswith("Reorder"):
                kern += ms
                continue
            reo += ms
            nbytes += int(args.get("output_size", 0))
            key = _reorder_key(args)
            if key is not None:
                by_shape[key] = by_shape.get(key, 0.0) + ms
        out.append(_RunKernels(kern, reo, nbytes, by_shape))
    return out


def micro_runner(
    worker: ThreadPoolExecutor,
    processor: Processor,
    backend: Backend,
    attrs: Mapping[str, object],
    tmp: str,
    runs: int = 15,
    warmup: int = 3,
) -> MicroRunner:
    """Runs a micro-model on ``worker`` as the runtime runs a part (inputs gathered, the run call,
    outputs collected and merged under a lock, marked busy for a throttled processor), and reads
    its kernels from a profiled twin session."""
    count = iter(range(1 << 30))

    def on_worker(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]):
        plain = make_session(model, processor, backend, **attrs)
        prefix = os.path.join(tmp, f"micro{next(count)}")
        prof = make_session(
            model, processor, backend, **attrs, enable_profiling=True, profile_file_prefix=prefix
        )
        outs = [o.name for o in plain.get_outputs()]
        lock, merged = threading.Lock(), {}

        def path() -> float:
            t0 = time.perf_counter_ns()
            with busy():
                args = {k: feeds[k] for k in feeds}
                got = dict(zip(outs, plain.run(outs, args)))
                with lock:
                    merged.update(got)
            return (time.perf_counter_ns() - t0) / 1e6

        times = [path() for _ in range(warmup + runs)][warmup:]
        for _ in range(warmup + runs):
            busy_call(prof.run, outs, dict(feeds))
        return times, prof.end_profiling()

    def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> MicroRun:
        times, trace = worker.submit(on_worker, model, feeds).result()
        per_run = _run_kernels(trace)[warmup:] or [_RunKernels(0.0, 0.0, 0, {})]
        keys = {key for r in per_run for key in r.by_shape}
        return MicroRun(
            float(np.median(times)),
            float(np.median([r.kernels_ms for r in per_run])),
            float(np.median([r.reorder_ms for r in per_run])),
            int(np.median([r.reorder_nbytes for r in per_run])),
            {key: float(np.median([r.by_shape.get(key, 0.0) for r in per_run])) for key in keys},
        )

    return run


@contextlib.contextmanager
def whole_model_timer(
    graph: ModelGraph,
    processor: Processor,
    backend: Backend,
    session_attrs: Mapping[str, object] | None = None,
) -> Iterator[Callable[[], float]]:
    """A timer of one whole-model run (ms) on the processor's own worker (pinned and throttled as
    the runtime's), timed from this thread through a hand-off, as a bundle's part is."""
    feeds = random_inputs(graph)
    with ThreadPoolExecutor(1, initializer=lambda: configure_as(processor)) as worker:
        sess = worker.submit(
            make_session, graph.model, processor, backend, **dict(session_attrs or {})
        ).result()

        def timed() -> float:
            t0 = time.perf_counter()
            worker.submit(busy_call, sess.run, None, feeds).result()
            return (time.perf_counter() - t0) * 1e3

        yield timed


def ort_contention(
    graph: ModelGraph,
    processor: Processor,
    backend: Backend,
    others: list[tuple[Processor, Backend]],
    session_attrs: Mapping[str, object] | None = None,
    rounds: int = 3,
    min_s: float = CONTENTION_MIN_S,
) -> dict[str, float]:
    """This pair's slowdown while each other processor runs the whole model in a loop on ORT
    (:func:`~edgesplit.profile.terms.contention_factor`: ``rounds`` rounds at least, ``min_s``
    long)."""
    attrs = dict(session_attrs or {})
    feeds = random_inputs(graph)
    out: dict[str, float] = {}
    with whole_model_timer(graph, processor, backend, attrs) as timed:
        for _ in range(2):
            timed()
        for other, other_backend in others:

            def setup(q: Processor = other, qb: Backend = other_backend):
                configure_as(q)
                s = make_session(graph.model, q, qb, **attrs)
                return lambda: busy_call(s.run, None, feeds)

            with BackgroundLoad(setup) as load:
                out[other.name] = contention_factor(timed, load, rounds, min_s)
    return out


@contextlib.contextmanager
def processor_worker(
    processor: Processor, prefix: str
) -> Iterator[tuple[ThreadPoolExecutor, str, list[str]]]:
    """The processor's worker thread, set up like the runtime's (pinned, throttled), a private
    temporary folder, and the notes the setup left: sessions built on the worker inherit its setup
    in ORT's threads, and runs timed from here go through a hand-off to it, as a bundle's part
    does."""
    notes: list[str] = []
    with (
        ThreadPoolExecutor(1, initializer=lambda: notes.extend(configure_as(processor))) as worker,
        tempfile.TemporaryDirectory(prefix=prefix) as tmp,
    ):
        yield worker, tmp, notes
