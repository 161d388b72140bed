"""Load on ``edgesplit serve`` while it is attacked: errors, wrong outputs, health latency, memory.

The server (its own process, default limits) serves two parts: the second half of a zoo model
(default tiny_dag, whose cut tensor is 64 KB FP32) and ``big``, the sum of a 60 MB FP32 tensor.
During the measured round, three things happen at once:

* the load: C asyncio clients in this process, each with its own keep-alive connection, send
  binary OIP requests for the zoo part back to back, N each; every answer is checked against ORT;
* the attack (a second process): S slow-loris sockets that send a request's headers one byte a
  second (the server answers 408 after its header timeout; each is reopened at once), and B
  threads that each send valid 60 MB requests to ``big`` back to back, so the server must read
  them: the in-flight limit admits four at a time and turns the rest away with 503 (and closes,
  rather than drain 60 MB); every 200 is checked;
* a health probe (a third process) that opens a new connection every 20 ms and times
  ``GET /v2/health/ready``.

The load clients and attackers run at nice 10 (``--nice``; the server and the probe at 0): on a
real network they are other machines, here they share the server's cores. The server's resident
memory is sampled every 20 ms. Goals (issue 12): 0 errors and 0 wrong outputs
over 64 x 200 requests, every health probe answered within 50 ms at p99, and peak RSS under the cap:
RSS after warm-up + the in-flight limit (256 MB) + 64 MB.

Run: .venv/bin/python benchmarks/server_load.py [--clients 64] [--requests 200] [--slow-loris 200]
     [--big-bodies 12] [--big-mb 60] [--nice 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netlab import (
    free_port,
    make_bundle,
    serve_command,
    single_tensor_cuts,
    stop_process,
    wait_ready,
)  # noqa: E402

from edgesplit.runtime import oip  # noqa: E402

INFLIGHT_MB = 256  # the server's default --max-inflight-mb
SLACK_MB = 64


async def client(
    url, body, headers, expected, n, latencies, errors, wrong, close: bool = False
) -> None:
    """``n`` binary OIP requests back to back on one keep-alive connection; each answer checked
    against ``expected`` (exactly, or within float tolerance with ``close``: batched runs)."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                async with session.post(
                    f"{url}/v2/models/p1/infer", data=body, headers=headers
                ) as r:
                    data = await r.read()
                    if r.status != 200:
                        errors.append(f"HTTP {r.status}: {data[:100]!r}")
                        continue
                    hlen = oip.parse_header_length(r.headers.get(oip.HEADER_LENGTH), len(data))
                    out = next(iter(oip.decode_response(data, hlen).values()))
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(e).__name__}: {e}")
                continue
            if not (
                np.allclose(out, expected, rtol=1e-4, atol=1e-5)
                if close
                else np.array_equal(out, expected)
            ):
                wrong.append(1)
                continue
            latencies.append((time.perf_counter() - t0) * 1e3)


async def load(url, body, headers, expected, clients, n):
    latencies: list[float] = []
    errors: list[str] = []
    wrong: list[int] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(client(url, body, headers, expected, n, latencies, errors, wrong) for _ in range(clients))
    )
    return latencies, errors, wrong, time.perf_counter() - t0


# ---- the attack and the probe, each in its own process


def _read_answer(s: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = next(int(h.split(b":")[1]) for h in lines if h.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed")
        body += chunk
    return int(lines[0].split()[1]), body


def _big_sender(
    port: int, body: memoryview, head: bytes, expected: float, stop, counts: dict, lock
) -> None:
    """Send valid big requests back to back; count the answers (a 200 is checked)."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(head)
                s.sendall(body)
                status, answer = _read_answer(s)
            if status == 200:
                got = float(np.frombuffer(answer[-4:], np.float32)[0])
                status = 200 if abs(got - expected) <= 1e-3 * expected else "200 WRONG"
        except (OSError, StopIteration, ValueError) as e:
            status = type(e).__name__  # turned away and closed while still sending
        with lock:
            counts[status] = counts.get(status, 0) + 1


def attack(port: int, slow_loris: int, big_bodies: int, big_mb: int, stop, ready, out) -> None:
    n = big_mb * (1 << 20) // 4
    x = {"name": "x", "shape": [n], "datatype": "FP32", "parameters": {"binary_data_size": n * 4}}
    header = json.dumps(
        {"inputs": [x], "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    ).encode()
    body = memoryview(header + np.ones(n, np.float32).tobytes())
    head = (
        f"POST /v2/models/big/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"{oip.HEADER_LENGTH}: {len(header)}\r\n\r\n"
    ).encode()
    counts: dict = {}
    lock = threading.Lock()
    senders = [
        threading.Thread(
            target=_big_sender, args=(port, body, head, float(n), stop, counts, lock), daemon=True
        )
        for _ in range(big_bodies)
    ]
    for t in senders:
        t.start()
    partial = b"POST /v2/models/p1/infer HTTP/1.1\r\nHost: x\r\nX-Slow: "
    socks: list[socket.socket | None] = [None] * slow_loris
    reopened = 0
    while not stop.is_set():
        for i in range(slow_loris):
            try:
                if socks[i] is None:
                    socks[i] = socket.create_connection(("127.0.0.1", port), timeout=5)
                    socks[i].sendall(partial)
                    reopened += 1
                socks[i].sendall(b"a")
            except OSError:
                if socks[i] is not None:
                    socks[i].close()
                socks[i] = None
        ready.set()
        stop.wait(1.0)
    for s in socks:
        if s is not None:
            s.close()
    for t in senders:
        t.join(60)
    out.put({"big": counts, "slow_loris_opened": reopened})


def probe(port: int, stop, ready, out) -> None:
    with contextlib.suppress(
        OSError
    ):  # back to the server's priority, if the main process lowered its own
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    latencies, failures = [], []
    request = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    ready.set()
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(request)
                data = s.recv(1024)
            if not data.startswith(b"HTTP/1.1 200"):
                failures.append(data[:60])
        except OSError as e:
            failures.append(str(e))
        latencies.append((time.perf_counter() - t0) * 1e3)
        stop.wait(0.02)
    out.put({"latencies": latencies, "failures": failures})


def with_big_part(bundle: Path, big_mb: int) -> Path:
    """Add a server part ``big`` to ``bundle``: the sum of a ``big_mb`` MB FP32 tensor."""
    import dataclasses

    from onnx import TensorProto, helper

    from edgesplit.bundle.format import (
        PartArtifact,
        TensorSpec,
        checksums,
        open_bundle,
        write_manifest,
    )

    n = big_mb * (1 << 20) // 4
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1, name="sum")],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, bundle / "parts/big.onnx")
    manifest = open_bundle(bundle)
    x, y = TensorSpec("x", (n,), "float32"), TensorSpec("y", (1,), "float32")
    big = PartArtifact(
        name="big",
        processor="gpu",
        backend="ort",
        file="parts/big.onnx",
        onnx_file="parts/big.onnx",
        inputs=(x,),
        outputs=(y,),
        depends_on=(),
        remote=True,
        fallback=None,
    )
    files = [*manifest.files, "parts/big.onnx"]
    write_manifest(
        bundle,
        dataclasses.replace(
            manifest,
            inputs=(
                *manifest.inputs,
                x,
            ),  # the bundle's checks want every part input to come from somewhere
            outputs=(*manifest.outputs, y),
            parts=(*manifest.parts, big),
            files=checksums(bundle, files),
        ),
    )
    return bundle


def sample_rss(pid: int, stop: threading.Event, peak: list[int]) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        stop.wait(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=200, help="per client")
    ap.add_argument("--model", default="tiny_dag")
    ap.add_argument(
        "--warmup", type=int, default=20, help="requests per client before measuring memory"
    )
    ap.add_argument("--slow-loris", type=int, default=200)
    ap.add_argument("--big-bodies", type=int, default=12)
    ap.add_argument("--big-mb", type=int, default=60)
    ap.add_argument(
        "--nice",
        type=int,
        default=10,
        help="niceness of the load clients and attackers (0: the server's): on a real network they "
        "run "
        "on other machines, here they share its cores",
    )
    args = ap.parse_args()
    from edgesplit.model import zoo

    with tempfile.TemporaryDirectory() as d:
        path = zoo.save(args.model, Path(d) / f"{args.model}.onnx")
        cuts = single_tensor_cuts(onnx.load(path))
        cut = cuts[len(cuts) // 2]
        bundle = with_big_part(
            make_bundle(path, Path(d) / "bundle", [cut], [False, True]), args.big_mb
        )
        spec = onnx.load(path).graph.input[0]
        shape = [dim.dim_value for dim in spec.type.tensor_type.shape.dim]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        mid = ort.InferenceSession(str(bundle / "parts/p0.onnx")).run(None, {spec.name: x})[0]
        expected = ort.InferenceSession(str(bundle / "parts/p1.onnx")).run(None, {cut: mid})[0]
        chunks, hlen = oip.encode_request({cut: mid})
        body = b"".join(bytes(c) for c in chunks)
        headers = {oip.HEADER_LENGTH: str(hlen), "Content-Type": "application/octet-stream"}

        port = free_port()
        proc = subprocess.Popen(
            serve_command(bundle, "127.0.0.1", port), stderr=open(Path(d) / "serve.log", "wb")
        )
        os.nice(args.nice)  # this process and the attack process it spawns; not the server
        ctx = mp.get_context("spawn")
        stop, results = ctx.Event(), ctx.Queue()
        ready = [ctx.Event(), ctx.Event()]
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, proc)
            _, warm_errors, warm_wrong, _ = asyncio.run(
                load(url, body, headers, expected, args.clients, args.warmup)
            )
            rss_warm = psutil.Process(proc.pid).memory_info().rss
            peak = [rss_warm]
            stop_rss = threading.Event()
            sampler = threading.Thread(
                target=sample_rss, args=(proc.pid, stop_rss, peak), daemon=True
            )
            sampler.start()
            side = [
                ctx.Process(
                    target=attack,
                    args=(
                        port,
                        args.slow_loris,
                        args.big_bodies,
                        args.big_mb,
                        stop,
                        ready[0],
                        results,
                    ),
                ),
                ctx.Process(target=probe, args=(port, stop, ready[1], results)),
            ]
            for p in side:
                p.start()
            found: dict = {}
            for r in (
                ready
            ):  # the slow-loris sockets are open, the big bodies flowing, the probe probing
                r.wait(120)
            time.sleep(1.0)
            cpu0 = sum(psutil.Process(proc.pid).cpu_times()[:2])
            lat, errors, wrong, wall_s = asyncio.run(
                load(url, body, headers, expected, args.clients, args.requests)
            )
            found["server_cpu_pct"] = (
                (sum(psutil.Process(proc.pid).cpu_times()[:2]) - cpu0) / wall_s * 100
            )
            found["load_avg"] = psutil.getloadavg()[0]
            stop.set()
            for _ in side:
                found.update(results.get(timeout=120))
            for p in side:
                p.join(60)
            stop_rss.set()
            sampler.join(5)
        finally:
            stop.set()
            died = proc.poll()
            stop_process(proc)
            if died is not None:
                print(
                    f"the server exited with {died}:",
                    (Path(d) / "serve.log").read_text()[-3000:],
                    file=sys.stderr,
                )

    report(
        args,
        mid,
        expected,
        lat,
        errors + warm_errors,
        wrong + warm_wrong,
        wall_s,
        rss_warm,
        peak[0],
        found,
    )


def report(args, mid, expected, lat, errors, wrong, wall_s, rss_warm, rss_peak, found) -> None:
    total = args.clients * args.requests
    health = np.array(found["latencies"])
    cap = rss_warm + (INFLIGHT_MB + SLACK_MB) * (1 << 20)
    print(
        f"{args.model} second half ({mid.nbytes:,} B in, {expected.nbytes:,} B out), "
        f"{args.clients} clients x "
        f"{args.requests} requests, loopback; clients and attackers at nice {args.nice} on the "
        "server's cores"
    )
    print(
        f"attack        {args.slow_loris} slow-loris sockets ({found['slow_loris_opened']} opened "
        "in all), "
        f"{args.big_bodies} senders of {args.big_mb} MB bodies: answers {found['big']}"
    )
    print(
        f"requests      {total}   errors {len(errors)}   wrong outputs {len(wrong)}"
        + (f" (first error: {errors[0]})" if errors else "")
    )
    print(
        f"throughput    {len(lat) / wall_s:,.0f} requests/s in {wall_s:.1f} s; server CPU "
        f"{found['server_cpu_pct']:.0f} % "
        f"of one core; machine load average {found['load_avg']:.1f} on {psutil.cpu_count()} cores"
    )
    print(
        f"latency       p50 {np.median(lat):.2f} ms   p99 {np.percentile(lat, 99):.2f} ms   max "
        f"{max(lat):.2f} ms"
    )
    print(
        f"health        {len(health)} probes, {len(found['failures'])} failed; p50 "
        f"{np.median(health):.2f} ms   "
        f"p99 {np.percentile(health, 99):.2f} ms   max {health.max():.2f} ms"
    )
    print(
        f"server RSS    {rss_warm / 2**20:.0f} MiB after warm-up, peak {rss_peak / 2**20:.0f} MiB "
        f"(cap {cap / 2**20:.0f} MiB = warm-up + {INFLIGHT_MB} MB in flight + {SLACK_MB} MB)"
    )
    ok = (
        not errors
        and not wrong
        and not found["failures"]
        and np.percentile(health, 99) <= 50
        and rss_peak <= cap
    )
    print(
        "goal: 0 errors, 0 wrong outputs, health p99 <= 50 ms, peak RSS under the cap: "
        + ("met" if ok else "NOT met")
    )


if __name__ == "__main__":
    main()
