"""Server overhead per 600 KB FP32 request on loopback, model compute excluded.

An Identity-like server part (input 1x150x32x32 FP32 = 614,400 bytes; the same bytes come back)
is served by ``edgesplit serve`` in its own process. Each request's overhead is its end-to-end
time at the client minus the ORT compute time the server measured for it (``Server-Timing:
compute``), so it holds the HTTP stack, the OIP codec, the thread-pool hop and both clients' work.
Measured with edgesplit's keep-alive client and with the official ``tritonclient.http``.

Goal (issue 5): <= 3 ms (KServe's Python ModelServer took 0.64 s per such request here).
Run: .venv/bin/python benchmarks/server_overhead.py [--requests 500] [--op Identity|Relu]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netlab import free_port, make_bundle, serve_command, stop_process, wait_ready  # noqa: E402

from edgesplit.runtime.client import OipClient  # noqa: E402

SHAPE = (1, 150, 32, 32)


def identity_bundle(tmp: Path, op: str) -> Path:
    g = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], name="op")],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp / "identity.onnx")
    return make_bundle(tmp / "identity.onnx", tmp / "bundle", [], [True])


def summarize(name: str, e2e: list[float], compute: list[float]) -> dict[str, float]:
    over = np.array(e2e) - np.array(compute)
    row = {
        "e2e_p50_ms": float(np.median(e2e)),
        "e2e_p90_ms": float(np.percentile(e2e, 90)),
        "compute_p50_ms": float(np.median(compute)),
        "overhead_p50_ms": float(np.median(over)),
        "overhead_p90_ms": float(np.percentile(over, 90)),
    }
    print(
        f"{name:<20}{row['e2e_p50_ms']:>10.3f}{row['e2e_p90_ms']:>10.3f}{row['compute_p50_ms']:>12.3f}"
        f"{row['overhead_p50_ms']:>14.3f}{row['overhead_p90_ms']:>14.3f}"
    )
    return row


def ours(url: str, x: np.ndarray, n: int) -> tuple[list[float], list[float]]:
    client = OipClient(url, timeout_s=30)
    e2e, compute = [], []
    for i in range(n + 30):
        t0 = time.perf_counter()
        out, ex = client.infer("p0", {"x": x}, ["y"])
        ms = (time.perf_counter() - t0) * 1e3
        assert out["y"].shape == SHAPE
        if i >= 30:
            e2e.append(ms)
            compute.append(ex.compute_ms)
    client.close()
    return e2e, compute


def triton(url: str, x: np.ndarray, n: int) -> list[float]:
    import tritonclient.http as th

    client = th.InferenceServerClient(url.removeprefix("http://"))
    inp = th.InferInput("x", list(SHAPE), "FP32")
    inp.set_data_from_numpy(x)
    outs = [th.InferRequestedOutput("y")]
    e2e = []
    for i in range(n + 30):
        t0 = time.perf_counter()
        r = client.infer("p0", [inp], outputs=outs)
        y = r.as_numpy("y")
        ms = (time.perf_counter() - t0) * 1e3
        assert y.shape == SHAPE
        if i >= 30:
            e2e.append(ms)
    client.close()
    return e2e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--op", default="Identity", choices=["Identity", "Relu"])
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        bundle = identity_bundle(Path(d), args.op)
        port = free_port()
        proc = subprocess.Popen(serve_command(bundle, "127.0.0.1", port), stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, proc)
            print(
                f"{args.op} part, {x.nbytes:,} B FP32 in and out, loopback, {args.requests} "
                "sequential requests"
            )
            print(
                f"{'client':<20}{'e2e p50':>10}{'e2e p90':>10}{'compute p50':>12}"
                f"{'overhead p50':>14}"
                f"{'overhead p90':>14}   (ms)"
            )
            e2e, compute = ours(url, x, args.requests)
            row = summarize("edgesplit client", e2e, compute)
            # tritonclient hides the response headers: its rows use the compute times measured
            # above.
            summarize("tritonclient.http", triton(url, x, args.requests), compute)
        finally:
            stop_process(proc)
    print(
        f"goal <= 3 ms overhead per request: {'met' if row['overhead_p50_ms'] <= 3 else 'NOT met'} "
        f"({row['overhead_p50_ms']:.3f} ms with edgesplit's client)"
    )


if __name__ == "__main__":
    main()
