"""Load on ``edgesplit serve``: C concurrent clients x N requests each, errors, latency and memory.

The server (its own process) serves the second half of a zoo model (default tiny_dag, whose cut
tensor is 64 KB FP32). The clients are C asyncio tasks in this process, each with its own
keep-alive connection, sending binary OIP requests back to back and checking every answer
against local ORT. The server's resident memory is read after a warm-up round and after the
measured round; it must stay flat (within 10 %).

Goal (issue 5): 64 clients x 200 requests, 0 errors, RSS flat within 10 %.
Run: .venv/bin/python benchmarks/server_load.py [--clients 64] [--requests 200] [--model tiny_dag]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netlab import free_port, make_bundle, serve_command, single_tensor_cuts, stop_process, wait_ready  # noqa: E402

from edgesplit.runtime import oip  # noqa: E402


async def client(
    url: str,
    body: bytes,
    headers: dict,
    expected: np.ndarray,
    n: int,
    latencies: list[float],
    errors: list[str],
) -> None:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                async with session.post(f"{url}/v2/models/p1/infer", data=body, headers=headers) as r:
                    data = await r.read()
                    if r.status != 200:
                        errors.append(f"HTTP {r.status}: {data[:100]!r}")
                        continue
                    hlen = oip.parse_header_length(r.headers.get(oip.HEADER_LENGTH), len(data))
                    out = next(iter(oip.decode_response(data, hlen).values()))
                if not np.array_equal(out, expected):
                    errors.append("wrong output")
                    continue
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(e).__name__}: {e}")
                continue
            latencies.append((time.perf_counter() - t0) * 1e3)


async def load(
    url: str, body: bytes, headers: dict, expected: np.ndarray, clients: int, n: int
) -> tuple[list[float], list[str], float]:
    latencies: list[float] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(client(url, body, headers, expected, n, latencies, errors) for _ in range(clients))
    )
    return latencies, errors, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=200, help="per client")
    ap.add_argument("--model", default="tiny_dag")
    ap.add_argument("--warmup", type=int, default=20, help="requests per client before measuring memory")
    args = ap.parse_args()
    from edgesplit.model import zoo

    with tempfile.TemporaryDirectory() as d:
        path = zoo.save(args.model, Path(d) / f"{args.model}.onnx")
        cuts = single_tensor_cuts(onnx.load(path))
        cut = cuts[len(cuts) // 2]
        bundle = make_bundle(path, Path(d) / "bundle", [cut], [False, True])
        spec = onnx.load(path).graph.input[0]
        shape = [dim.dim_value for dim in spec.type.tensor_type.shape.dim]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        mid = ort.InferenceSession(str(bundle / "parts/p0.onnx")).run(None, {spec.name: x})[0]
        expected = ort.InferenceSession(str(bundle / "parts/p1.onnx")).run(None, {cut: mid})[0]
        chunks, hlen = oip.encode_request({cut: mid})
        body = b"".join(bytes(c) for c in chunks)
        headers = {oip.HEADER_LENGTH: str(hlen), "Content-Type": "application/octet-stream"}

        port = free_port()
        proc = subprocess.Popen(serve_command(bundle, "127.0.0.1", port), stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, proc)
            server = psutil.Process(proc.pid)
            _, warm_errors, _ = asyncio.run(load(url, body, headers, expected, args.clients, args.warmup))
            rss_before = server.memory_info().rss
            lat, errors, wall_s = asyncio.run(load(url, body, headers, expected, args.clients, args.requests))
            rss_after = server.memory_info().rss
        finally:
            stop_process(proc)

    total = args.clients * args.requests
    drift = (rss_after - rss_before) / rss_before * 100
    print(
        f"{args.model} second half ({mid.nbytes:,} B in, {expected.nbytes:,} B out), "
        f"{args.clients} clients x {args.requests} requests, loopback, 2 cores shared by clients and server"
    )
    print(
        f"requests      {total}   errors {len(errors) + len(warm_errors)}"
        + (f" (first: {(errors + warm_errors)[0]})" if errors or warm_errors else "")
    )
    print(f"throughput    {len(lat) / wall_s:,.0f} requests/s")
    print(
        f"latency       p50 {np.median(lat):.2f} ms   p99 {np.percentile(lat, 99):.2f} ms   "
        f"max {max(lat):.2f} ms"
    )
    print(
        f"server RSS    {rss_before / 2**20:.1f} MiB after warm-up -> {rss_after / 2**20:.1f} MiB after "
        f"({drift:+.1f} %)"
    )
    ok = not errors and not warm_errors and abs(drift) <= 10
    print(f"goal: 0 errors and RSS flat within 10 %: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
