"""Dynamic batching on ``edgesplit serve``: throughput and p50/p99 latency against concurrency.

The server (its own process) serves the server part of each model in ``--model`` in turn, on the
CPU here:

* a zoo model (``squeezenet``: its second half, cut in the middle): convolutions, bound by their
  FLOPs on a CPU, which batching does not reduce;
* ``mlp``: a weight-bound part built here, an MLP head offloaded to the server (``--mlp-width``
  wide, ``--mlp-layers`` fully connected layers, fp32; the device keeps the first layer, the server
  the rest: 2 x 4096 x 4096 weights, 128 MB, by default). One request is a matrix-vector product
  that reads every weight; a batch of B turns it into a matrix-matrix product that reads them once.

For each
mode (unbatched: ``--max-batch 1``; batched: ``--max-batch B --max-queue-delay-ms D``) and each
concurrency C in 1, 8, 32, 64, C asyncio clients in this process, each with its own keep-alive
connection, send binary OIP requests back to back (each client its own input), R requests each
after a short warm-up. Every answer is checked against ONNX Runtime run on that request alone
(``np.allclose`` with rtol 1e-4, atol 1e-5: a batch takes another kernel path, GEMM for GEMV, whose
sums run in another order).

The clients run at nice 10 (``--nice``; the server at 0): on a real network they are other
machines, here they share the server's cores. Figures on a shared machine are noisy.
Goal (issue 14): batching raises throughput at 32 clients by at least 1.5x on the CPU part.

Run: .venv/bin/python benchmarks/server_batching.py [--model squeezenet,mlp] [--requests 40]
     [--max-batch 32] [--delay-ms 2] [--concurrency 1,8,32,64] [--threads 2] [--nice 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from model_builders import mlp_graph  # noqa: E402
from netlab import (
    free_port,
    make_bundle,
    serve_command,
    single_tensor_cuts,
    stop_process,
    wait_ready,
)  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_load import client  # noqa: E402 - the same checked OIP client

from edgesplit.runtime import oip  # noqa: E402


def mlp_model(path: Path, width: int, layers: int, seed: int = 0) -> tuple[Path, str]:
    """An MLP of ``layers`` ``Gemm`` layers ``width`` wide (ReLU between them), input ``x`` [1,
    width];
    returns the path and the cut tensor (after the first layer: the server gets the rest)."""
    model = onnx.helper.make_model(
        mlp_graph(width, layers, seed=seed), opset_imports=[onnx.helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    return path, "relu0"


async def load(url, requests, expected, clients: int, n: int):
    latencies: list[float] = []
    errors: list[str] = []
    wrong: list[int] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            client(url, *requests[k], expected[k], n, latencies, errors, wrong, close=True)
            for k in range(clients)
        )
    )
    return latencies, errors + ["wrong output"] * len(wrong), time.perf_counter() - t0


def make_requests(bundle: Path, model: Path, cut: str, count: int):
    """``count`` different requests for p1, with p1's output for each computed alone by ORT."""
    spec = onnx.load(model).graph.input[0]
    shape = [d.dim_value for d in spec.type.tensor_type.shape.dim]
    p0 = ort.InferenceSession(str(bundle / "parts/p0.onnx"))
    p1 = ort.InferenceSession(str(bundle / "parts/p1.onnx"))
    rng = np.random.default_rng(0)
    requests, expected = [], []
    for _ in range(count):
        mid = p0.run(None, {spec.name: rng.standard_normal(shape).astype(np.float32)})[0]
        expected.append(p1.run(None, {cut: mid})[0])
        chunks, hlen = oip.encode_request({cut: mid})
        headers = {oip.HEADER_LENGTH: str(hlen), "Content-Type": "application/octet-stream"}
        requests.append((b"".join(bytes(c) for c in chunks), headers))
    return requests, expected, mid.nbytes


def run_mode(bundle: Path, d: Path, flags: list[str], args, requests, expected) -> dict[int, tuple]:
    port = free_port()
    log = d / f"serve-{flags[1]}.log"
    proc = subprocess.Popen(
        serve_command(bundle, "127.0.0.1", port, "--threads", str(args.threads), *flags),
        stderr=open(log, "wb"),
        preexec_fn=lambda: os.nice(
            -args.nice
        ),  # back to the server's priority (this process is niced)
    )
    rows: dict[int, tuple] = {}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        for c in args.concurrency:
            asyncio.run(load(url, requests, expected, c, args.warmup))
            lat, errors, wall_s = asyncio.run(load(url, requests, expected, c, args.requests))
            rows[c] = (
                len(lat) / wall_s,
                np.median(lat),
                np.percentile(lat, 99),
                len(errors),
                errors[:1],
            )
    finally:
        died = proc.poll()
        stop_process(proc)
        notes = [ln for ln in log.read_text().splitlines() if "note:" in ln]
        if died is not None:
            print(f"the server exited with {died}:", log.read_text()[-3000:], file=sys.stderr)
        for n in notes:
            print(n)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", default="squeezenet,mlp", help="zoo models and/or mlp, comma-separated"
    )
    ap.add_argument("--mlp-width", type=int, default=4096)
    ap.add_argument(
        "--mlp-layers", type=int, default=3, help="the device runs the first, the server the rest"
    )
    ap.add_argument("--requests", type=int, default=40, help="per client, per concurrency")
    ap.add_argument("--warmup", type=int, default=3, help="per client before each measured round")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument(
        "--threads", type=int, default=2, help="the server's compute threads (serve --threads)"
    )
    ap.add_argument(
        "--nice", type=int, default=10, help="niceness of the clients (the server stays at 0)"
    )
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    os.nice(args.nice)
    for name in args.model.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            if name == "mlp":
                path, cut = mlp_model(d / "mlp.onnx", args.mlp_width, args.mlp_layers)
                label = (
                    f"mlp ({args.mlp_layers - 1} x {args.mlp_width}x{args.mlp_width} fp32 Gemm "
                    "on the server)"
                )
            else:
                from edgesplit.model import zoo

                path = zoo.save(name, d / f"{name}.onnx")
                cuts = single_tensor_cuts(onnx.load(path))
                cut, label = cuts[len(cuts) // 2], f"{name} second half"
            bundle = make_bundle(path, d / "bundle", [cut], [False, True])
            requests, expected, nbytes = make_requests(bundle, path, cut, max(args.concurrency))
            modes = {
                "unbatched": ["--max-batch", "1"],
                "batched": [
                    "--max-batch",
                    str(args.max_batch),
                    "--max-queue-delay-ms",
                    f"{args.delay_ms:g}",
                ],
            }
            results = {
                m: run_mode(bundle, d, flags, args, requests, expected)
                for m, flags in modes.items()
            }
        report(args, f"{label} (cut at {cut}, {nbytes:,} B per request)", results)


def report(args, what: str, results: dict[str, dict[int, tuple]]) -> None:
    print()
    print(
        f"{what}, CPU, {args.threads} compute "
        f"threads; batched: --max-batch {args.max_batch} --max-queue-delay-ms {args.delay_ms:g}; "
        f"{args.requests} requests per client; clients at nice {args.nice} on the server's "
        f"{os.cpu_count()} cores"
    )
    print(
        "every answer checked against ONNX Runtime run on that request alone (np.allclose, rtol "
        "1e-4, "
        "atol 1e-5); errors count wrong outputs too"
    )
    print(f"{'clients':>7} | {'mode':>9} | {'req/s':>8} | {'p50 ms':>8} | {'p99 ms':>8} | errors")
    for c in args.concurrency:
        for name, rows in results.items():
            rps, p50, p99, nerr, first = rows[c]
            print(
                f"{c:>7} | {name:>9} | {rps:>8.1f} | {p50:>8.2f} | {p99:>8.2f} | {nerr}"
                + (f" ({first[0]})" if first else "")
            )
    for c in args.concurrency:
        gain = results["batched"][c][0] / results["unbatched"][c][0]
        print(f"throughput gain at {c} clients: {gain:.2f}x")
    if 32 in args.concurrency:
        gain = results["batched"][32][0] / results["unbatched"][32][0]
        print(f"goal: >= 1.5x at 32 clients: {'met' if gain >= 1.5 else 'NOT met'} ({gain:.2f}x)")


if __name__ == "__main__":
    main()
