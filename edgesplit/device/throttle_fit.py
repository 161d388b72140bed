"""What the duty cycle's spinner must be told so that the work it serves gets its share of a core.

Each pre-emption by the spinner costs the served work more than the spinner's own slice (the
switches, the caches and TLB the work refills). Measured on this machine's cores with a 200 us
period: a spinner taking 60% of every period left ONNX Runtime's convolutions 26-27% of the core,
not 40% (resnet18, mobilenetv2 and squeezenet on one thread; 36% at a 1 ms period, 39% at 5 ms);
a compiled spinner lost as much as the Python one. So the spinner spins less: the share it is told
is fitted, by timing a small convolution model on the core with the duty cycle and without, until
the work gets the share asked for (two rounds of the correction ``told += asked - got``).

The fit is kept per machine, core, share and period (``$EDGESPLIT_CACHE/throttle/``), so that the
profiler and the runtime, in different processes, emulate the same little core.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
from collections.abc import Callable

ROUNDS = 2
"""Corrections of the told share, each from one measurement."""

MAX_TOLD = 0.95
"""The most the spinner is told to leave (it must still take some of each period)."""


def _workload() -> Callable[[], None]:
    """One run of a small convolution in ONNX Runtime on one thread (about 1 ms on a core here):
    the kind of work the duty cycle serves."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "duty_cycle_fit",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 56, 56])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"x": rng.standard_normal((1, 32, 56, 56)).astype(np.float32)}
    return lambda: sess.run(None, feed)


def _timed_ms(run: Callable[[], None], repeat: int, runs: int = 3) -> float:
    best = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(repeat):
            run()
        best.append((time.perf_counter() - t0) * 1e3)
    return sorted(best)[len(best) // 2]


def _on_core(core: int, fn: Callable[[], float]) -> float:
    """``fn()`` on a fresh thread pinned to ``core``."""
    from edgesplit.device.cpu import run_as_processor

    return float(run_as_processor(f"duty-fit-{core}", (core,), None, fn)[0])


def measure_share(
    core: int, told: float, period_us: int, run: Callable[[], None], repeat: int
) -> float:
    """The share of ``core`` that work gets while a spinner told ``told`` cycles there."""
    from edgesplit.device.throttle import DutyCycle

    full = _on_core(core, lambda: _timed_ms(run, repeat))
    cycle = DutyCycle((core,), told, period_us, fitted=False)
    try:

        def slow() -> float:
            cycle.enter()
            try:
                return _timed_ms(run, repeat)
            finally:
                cycle.leave()

        throttled = _on_core(core, slow)
    finally:
        cycle.close()
    return full / throttled


def fit_share(core: int, share: float, period_us: int) -> float:
    """The share to tell a spinner on ``core`` so that the work there gets ``share`` (fitted
    here)."""
    run = _workload()
    run()
    repeat = max(1, int(round(4.0 / max(_on_core(core, lambda: _timed_ms(run, 1)), 0.05))))
    told = share
    for _ in range(ROUNDS):
        got = measure_share(core, told, period_us, run, repeat)
        told = min(MAX_TOLD, max(share, told + share - got))
    return told


_memo: dict[tuple[int, float, int], float] = {}
_memo_lock = threading.Lock()


def told_share(core: int, share: float, period_us: int) -> float:
    """:func:`fit_share`, kept per process and on disk (see the module doc); the share itself when
    ``EDGESPLIT_THROTTLE_FIT=0`` or when the fit fails."""
    if os.environ.get("EDGESPLIT_THROTTLE_FIT", "1") == "0":
        return share
    key = (core, round(share, 6), period_us)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
        path = _kept_path(key)
        told = _read(path)
        if told is None:
            try:
                told = fit_share(core, share, period_us)
            except (OSError, RuntimeError, ImportError):
                return share
            if share < told < MAX_TOLD:
                _write(path, told)
            # else a bound was hit: the spinner costing nothing, or too much to correct, is what a
            # fit beside other work on the core gives (0.4 and 0.69 at 40% here, against 0.53-0.55
            # quiet); this process uses it, and the next one fits again
        _memo[key] = told
        return told


def _kept_path(key: tuple[int, float, int]):
    from edgesplit.cache import cache_root
    from edgesplit.device.host import cpu_model

    core, share, period = key
    machine = "".join(ch if ch.isalnum() else "-" for ch in f"{platform.node()}-{cpu_model()}")[:80]
    return cache_root() / "throttle" / f"{machine}-core{core}-{share:g}-{period}us.json"


def _read(path) -> float | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        told = float(json.loads(path.read_text())["told_share"])
        if 0 < told <= MAX_TOLD:
            return told
    return None


def _write(path, told: float) -> None:
    from edgesplit.util import atomic_write_text

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"told_share": told}) + "\n")
