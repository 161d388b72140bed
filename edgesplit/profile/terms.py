"""Measure what a part run costs beyond its kernels, on the device itself (:class:`RunTerms`).

Each backend's profiler calls these with its own way of running a micro-model on the processor's
worker thread (a :class:`MicroRunner`), so that the terms are measured as the runtime pays them:

* the fixed cost of a part run and the per-MB cost of its inputs and outputs: micro-models of one
  node (``Neg`` on one float and on a large tensor, ``ReduceSum`` of a large tensor to one float),
  the run minus the kernels the backend reports;
* the layout reorders at a part boundary: ``Conv`` micro-models whose inputs and outputs cross the
  boundary; the backend reports the reorder kernels it added (ORT's NCHWc). One micro-model has a
  branch per shape of the model's own blocked tensors, so each of them gets its own figure (a
  reorder's cost per byte varies 3-4x with the channel count at equal bytes); a per-MB rate from
  two sizes covers the rest;
* the hand-off to the worker after realistic idle gaps, and the caller's wake-up when a request
  ends after it waited as long (a thread wake-up after a long idle gap is several times slower
  than back-to-back: measured 0.05 ms against 0.2-0.35 ms here);
* the Session's own per-request work, through a mirror of its request path (calibrate refits it
  from the real Session);
* contention: the slowdown of this processor while another runs a model of its own.

Nothing here imports a backend: the runners are the profilers' (``ort.py``, ``tvm.py``).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgesplit.profile.store import RunTerms

MB = 1e6
MAX_REORDER_SHAPES = 32  # branches of the reorder micro-model (squeezenet has 16 blocked shapes)
IDLE_GAPS_MS = (0.0, 1.0, 2.0, 5.0, 20.0)
BIG_FLOATS = 1 << 20  # 4 MB of float32: large enough that per-byte costs dominate the fixed ones
_clock = time.perf_counter_ns


@dataclass(frozen=True)
class MicroRun:
    """Medians over the timed runs of one micro-model on the processor's worker.

    Attributes:
        path_ms: The part run as the runtime does it (inputs gathered, the backend's call, outputs
            collected), timed on the worker.
        kernels_ms: The kernels the backend reports inside it, reorders excluded.
        reorder_ms: The layout reorder kernels among them (0 where the backend adds none).
        reorder_nbytes: Bytes those reorders moved (0 where none).
        reorders_by_shape: The reorders by direction and NCHW shape: ``("in", (1, 64, 28, 28))``
            into the blocked layout, ``"out"`` out of it -> ms (empty where the backend adds none).
    """

    path_ms: float
    kernels_ms: float
    reorder_ms: float = 0.0
    reorder_nbytes: int = 0
    reorders_by_shape: Mapping[tuple[str, tuple[int, ...]], float] = field(default_factory=dict)


# A backend's micro-runner: runs an ONNX model (with these inputs) ``runs`` times on the worker.
MicroRunner = Callable[[onnx.ModelProto, Mapping[str, np.ndarray]], MicroRun]


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    m = helper.make_model(
        helper.make_graph(nodes, "micro", inputs, outputs, list(initializers)),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    m.ir_version = 8
    return m


def neg_model(n: int) -> onnx.ModelProto:
    """One ``Neg`` on ``n`` floats: input and output of ``4 n`` bytes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    return _model([helper.make_node("Neg", ["x"], ["y"])], [x], [y])


def reduce_model(n: int) -> onnx.ModelProto:
    """``ReduceSum`` of ``n`` floats to one: a large input, a tiny output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    return _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], [x], [y], [axes]
    )


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def io_terms(run: MicroRunner) -> tuple[float, float, float]:
    """``(part_fixed_ms, input_ms_per_mb, output_ms_per_mb)`` from three micro-models.

    The overhead of a run is its path minus its kernels; the fixed cost is that of ``Neg`` on one
    float, the per-MB costs are the slopes to ``ReduceSum`` (a large input only) and to ``Neg``
    on a large tensor (large input and output).
    """
    small, neg, red = (
        run(m, _feeds(m)) for m in (neg_model(1), neg_model(BIG_FLOATS), reduce_model(BIG_FLOATS))
    )
    fixed = max(small.path_ms - small.kernels_ms, 0.0)
    mb = 4 * BIG_FLOATS / MB
    per_in = max(red.path_ms - red.kernels_ms - fixed, 0.0) / mb
    per_out = max(neg.path_ms - neg.kernels_ms - fixed - per_in * mb, 0.0) / mb
    return fixed, per_in, per_out


def branches_model(shapes: Sequence[tuple[int, ...]]) -> onnx.ModelProto:
    """A 1x1 ``Conv`` per NCHW shape, side by side: every branch's input and output cross a part
    boundary, so ORT's NCHWc layout brackets each with a reorder in and one out, of that shape."""
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, weights = [], [], [], []
    for i, shape in enumerate(shapes):
        c = shape[1]
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(shape)))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, list(shape)))
        w = (rng.standard_normal((c, c, 1, 1)) * 0.05).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [f"x{i}", f"w{i}"], [f"y{i}"]))
    return _model(nodes, inputs, outputs, weights)


def reorder_table(
    run: MicroRunner, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, float], dict[str, float]]:
    """``(into, out of)`` the blocked layout: per tensor, one reorder's ms, measured on
    :func:`branches_model` of the tensors' shapes (4-D ones, the most common shapes first, at most
    :data:`MAX_REORDER_SHAPES`; the others are left to the per-MB rate). Empty where the backend
    adds no reorders."""
    count: dict[tuple[int, ...], int] = {}
    for shape in shapes.values():
        if len(shape) == 4 and shape[0] == 1 and min(shape) > 0:
            count[shape] = count.get(shape, 0) + 1
    chosen = sorted(count, key=lambda sh: (-count[sh], -math.prod(sh)))[:MAX_REORDER_SHAPES]
    if not chosen:
        return {}, {}
    m = branches_model(chosen)
    by_shape = run(m, _feeds(m)).reorders_by_shape
    into, out = {}, {}
    for tensor, shape in shapes.items():
        if ("in", shape) in by_shape and ("out", shape) in by_shape:  # one branch per shape
            into[tensor] = round(by_shape["in", shape], 6)
            out[tensor] = round(by_shape["out", shape], 6)
    return into, out


def reorder_ms_per_mb(
    run: MicroRunner, channels: int = 64, sides: Sequence[int] = (28, 56)
) -> float | None:
    """Reorder time per MB moved, from Conv micro-models at two sizes (None when the backend
    inserts no reorders there)."""
    total_ms, total_nbytes = 0.0, 0
    for side in sides:
        m = branches_model([(1, channels, side, side)])
        got = run(m, _feeds(m))
        total_ms += got.reorder_ms
        total_nbytes += got.reorder_nbytes
    if total_nbytes == 0:
        return None
    return total_ms / (total_nbytes / MB)


def wakeups(worker: ThreadPoolExecutor, repeats: int = 12) -> tuple[tuple[float, ...], ...]:
    """``(idle gaps, hand-off ms, return ms)``: medians after each gap of :data:`IDLE_GAPS_MS`.

    The hand-off is submit -> the worker starts, after the worker idled for the gap; the return is
    the worker's last clock read -> the caller resumes, after the caller waited for the gap.
    """
    handoff, back = [], []
    for gap_ms in IDLE_GAPS_MS:
        h = []
        for _ in range(repeats):
            if gap_ms:
                time.sleep(gap_ms / 1e3)
            t0 = _clock()
            h.append((worker.submit(_clock).result() - t0) / 1e6)
        r = []
        for _ in range(repeats):
            t1 = worker.submit(_sleep_then_clock, gap_ms).result()
            r.append((_clock() - t1) / 1e6)
        handoff.append(round(statistics.median(h), 6))
        back.append(round(statistics.median(r), 6))
    return IDLE_GAPS_MS, tuple(handoff), tuple(back)


def _sleep_then_clock(gap_ms: float) -> int:
    if gap_ms:
        time.sleep(gap_ms / 1e3)
    return _clock()


def _mirror_request(
    worker: ThreadPoolExecutor, call: Callable[[], object], lock: threading.Lock
) -> float:
    """One request through a mirror of the Session's path; its time outside the part's run (ms)."""
    t0 = _clock()
    inputs = {"x": np.ones(1, np.float32)}
    state = {"tensors": {k: np.asarray(v) for k, v in inputs.items() if v.shape == (1,)}, "left": 1}
    done: Future = Future()
    box: dict[str, int] = {}

    def work() -> None:
        s = _clock()
        out = call()
        with lock:
            state["tensors"]["y"] = out
            state["left"] -= 1
        box["span"] = _clock() - s
        done.set_result(state["tensors"])

    worker.submit(work)
    done.result()
    return (_clock() - t0 - box["span"]) / 1e6


def session_ms(
    worker: ThreadPoolExecutor,
    call: Callable[[], object],
    handoff0_ms: float,
    return0_ms: float,
    repeats: int = 30,
) -> float:
    """Per request, the Session's own work beyond the part run and the two wake-ups, measured
    through a mirror of its request path (inputs checked, request state, a future, the outputs
    merged under a lock, the result set)."""
    lock = threading.Lock()
    samples = [_mirror_request(worker, call, lock) for _ in range(repeats + 3)][3:]
    return max(statistics.median(samples) - handoff0_ms - return0_ms, 0.0)


def solo_session_ms(call: Callable[[], object], repeats: int = 30) -> float:
    """Per request of a bundle of one local part, the Session's own work beyond the part run,
    measured through a mirror of that path on the calling thread (see ``Session.run``): the
    request's type and size looked at, the run, its names and dtypes checked, one timing tuple
    kept and the outputs named."""
    x = np.ones(1, np.float32)
    inputs, dtypes, kept = {"x": x}, [("x", x.dtype)], deque(maxlen=repeats + 3)
    samples, plain = [], True
    for _ in range(repeats + 3):
        t0 = _clock()
        raw = None
        if type(inputs) is dict and len(inputs) == len(dtypes):
            s = _clock()
            raw = (call(),)
            span = _clock() - s
            for name, dtype in dtypes:
                value = inputs[name]
                if type(value) is not np.ndarray or value.dtype is not dtype:
                    raw = None
                    break
        plain = plain and raw is not None
        kept.append((t0, s, _clock()))
        out = dict(zip(("y",), raw or ()))
        samples.append((_clock() - t0 - span) / 1e6)
    assert plain and out  # the mirror's request is the plain one it prices
    return max(statistics.median(samples[3:]), 0.0)


CONTENTION_S_PER_RUN = 0.1  # alternate 0.1 s per timed run asked for (2 s at the default 20 runs)
CONTENTION_MIN_S = 2.0  # CONTENTION_S_PER_RUN at ProfileOptions' default of 20 runs
CONTENTION_MAX_ROUNDS = 40


def contention_factor(
    timed: Callable[[], float],
    load: BackgroundLoad,
    rounds: int = 3,
    min_s: float = CONTENTION_MIN_S,
) -> float:
    """The median over rounds of one round's ratio: ``timed()``'s median while ``load`` runs over
    its median alone just before. At least ``rounds`` rounds, and more until ``min_s`` has passed.

    Each ratio is taken within one round, so that drift on a shared machine cancels; and the rounds
    go on for a fixed time, not a fixed count, because a whole squeezenet run here is 12 ms: four
    rounds of 3 + 3 runs (0.4 s) measured 0.92-1.46 for two cores that slow each other by 1.00
    (a second process spinning or streaming memory on the other core: 0.94-1.15x in 4 s blocks).
    """
    ratios: list[float] = []
    t0 = time.perf_counter()
    while len(ratios) < rounds or (
        time.perf_counter() - t0 < min_s and len(ratios) < CONTENTION_MAX_ROUNDS
    ):
        alone = statistics.median(timed() for _ in range(3))
        load.on()
        try:
            loaded = statistics.median(timed() for _ in range(3))
        finally:
            load.off()
        if alone > 0:
            ratios.append(loaded / alone)
    return round(statistics.median(ratios), 4) if ratios else 1.0


class BackgroundLoad:
    """Another processor's work in a loop on a thread of its own, switched on and off.

    ``setup`` runs on that thread first (pin it, throttle it, build a session) and returns the
    function to loop. Use as a context manager; the thread ends on exit.
    """

    def __init__(self, setup: Callable[[], Callable[[], object]]):
        self._setup = setup
        self._running = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._idle = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._body, daemon=True, name="edgesplit-load")

    def _body(self) -> None:
        try:
            fn = self._setup()
        except BaseException as e:  # noqa: BLE001 - re-raised by __enter__
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        while not self._stop.is_set():
            if not self._running.is_set():
                self._idle.set()
                self._running.wait(timeout=0.05)
                continue
            self._idle.clear()
            fn()
        self._idle.set()

    def on(self) -> None:
        self._idle.clear()
        self._running.set()

    def off(self) -> None:
        self._running.clear()
        self._idle.wait(timeout=120)  # the run in flight finishes first

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._running.set()
        self._thread.join(timeout=120)


def build_terms(
    run: MicroRunner,
    worker: ThreadPoolExecutor,
    trivial_call: Callable[[], object],
    *,
    blocked: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
    blocked_shapes: Mapping[str, tuple[int, ...]] | None = None,
    reorders: bool = True,
    repeats: int = 12,
) -> RunTerms:
    """Every term of one pair that needs no other processor (contention is added later);
    ``repeats`` wake-ups are timed after each idle gap; ``blocked_shapes``: the blocked tensors'
    shapes, for their own reorder figures."""
    fixed, per_in, per_out = io_terms(run)
    gaps, handoff, back = wakeups(worker, repeats)
    into, out = reorder_table(run, blocked_shapes or {}) if reorders else ({}, {})
    return RunTerms(
        part_fixed_ms=round(fixed, 6),
        input_ms_per_mb=round(per_in, 6),
        output_ms_per_mb=round(per_out, 6),
        reorder_ms_per_mb=_round(reorder_ms_per_mb(run)) if reorders else None,
        reorder_in_ms=into,
        reorder_out_ms=out,
        blocked_tensors=blocked[0],
        blocked_readers=blocked[1],
        handoff_idle_ms=gaps,
        handoff_ms=handoff,
        return_ms=back,
        session_ms=round(session_ms(worker, trivial_call, handoff[0], back[0], 2 * repeats), 6),
        solo_session_ms=round(solo_session_ms(trivial_call, 2 * repeats), 6),
    )


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 6)
