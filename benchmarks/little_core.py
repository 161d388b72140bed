"""How steady is the emulated little core? The cgroup CPU quota against the real-time duty cycle.

``host-biglittle``'s little processor is core 1 given 40% of its time. This runs the same ORT
models (a conv stack sized to take about 0.1, 0.5, 2 and 8 ms at full speed) on a worker thread
pinned to core 1, at full speed and under each emulation, in alternating blocks, and prints per
size: the median, the p10-p90 spread, the coefficient of variation, the median slowdown against
full speed (ideal: 100 / quota = 2.5x), and the served thread's own CPU time per run against full
speed's (ideal 1.0x: an emulation that only takes time away leaves the work's CPU time alone; where
it is above 1, the work itself runs slower between the emulation's interruptions).

    .venv/bin/python benchmarks/little_core.py [--quota-pct 40] [--runs 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from edgesplit.backends.ort.profile import time_runs
from edgesplit.device.cpu import configure_thread, ort_session_options
from edgesplit.device.throttle import busy_call

CORE = 1


def conv_stack(channels: int, size: int, depth: int) -> bytes:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(depth):
        w = numpy_helper.from_array(
            (rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32), f"w{i}"
        )
        inits.append(w)
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    g = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, size, size])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


SIZES = {"~0.1 ms": (16, 16, 2), "~0.5 ms": (32, 28, 3), "~2 ms": (32, 56, 3), "~8 ms": (64, 56, 3)}


def worker(method: str | None, quota_pct: float) -> ThreadPoolExecutor:
    if method:
        os.environ["EDGESPLIT_THROTTLE"] = method
    pool = ThreadPoolExecutor(
        1, initializer=lambda: configure_thread("little", (CORE,), quota_pct if method else None)
    )
    pool.submit(lambda: None).result()
    return pool


def measure(pool: ThreadPoolExecutor, model: bytes, runs: int) -> tuple[list[float], list[float]]:
    """Wall ms per run (through the hand-off to the worker) and the worker thread's CPU ms per
    run."""
    import onnxruntime as ort

    def build():
        return ort.InferenceSession(
            model, ort_session_options(1, (CORE,)), providers=["CPUExecutionProvider"]
        )

    sess = pool.submit(build).result()
    x = {
        "x": np.random.default_rng(1).standard_normal(sess.get_inputs()[0].shape).astype(np.float32)
    }
    cpu_ms: list[float] = []

    def run() -> None:
        t0 = time.thread_time()
        busy_call(sess.run, None, x)
        cpu_ms.append((time.thread_time() - t0) * 1e3)

    wall = time_runs(lambda: pool.submit(run).result(), runs, 10)
    return wall, cpu_ms[-runs:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quota-pct", type=float, default=40.0)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    methods = {"full speed": None, "cgroup quota": "cgroup-quota", "duty cycle": "duty-cycle"}
    pools = {name: worker(m, args.quota_pct) for name, m in methods.items()}
    models = {k: conv_stack(*v) for k, v in SIZES.items()}
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):  # alternate blocks to cancel drift
        for size, model in models.items():
            for name, pool in pools.items():
                wall, cpu_ms = measure(pool, model, args.runs // args.rounds)
                times.setdefault((size, name), []).extend(wall)
                cpu.setdefault((size, name), []).extend(cpu_ms)
    print(
        f"little core = core {CORE} at {args.quota_pct:g}%; ideal slowdown "
        f"{100 / args.quota_pct:.2f}x"
    )
    print(
        f"{'work':<9} {'emulation':<13} {'median ms':>10} {'p10-p90 ms':>16} {'cv %':>6} "
        f"{'slowdown':>9}"
        f" {'cpu/run':>8}"
    )
    for size in models:
        full = float(np.median(times[(size, "full speed")]))
        full_cpu = float(np.median(cpu[(size, "full speed")]))
        for name in methods:
            t = np.asarray(times[(size, name)])
            med = float(np.median(t))
            print(
                f"{size:<9} {name:<13} {med:>10.3f} "
                f"{np.percentile(t, 10):>7.3f}-{np.percentile(t, 90):<8.3f}"
                f" {100 * t.std() / t.mean():>6.1f} {med / full:>8.2f}x"
                f" {float(np.median(cpu[(size, name)])) / full_cpu:>7.2f}x"
            )
    for pool in pools.values():
        pool.shutdown()


if __name__ == "__main__":
    main()
