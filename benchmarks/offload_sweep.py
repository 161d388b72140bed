"""Offloading sweep on a really shaped network from a really slower device: predicted vs measured.

The lab (tests/netlab.py): the server is ``edgesplit serve`` in its own network namespace, behind
a veth pair that ``tc tbf`` shapes to B Mbit/s each way, with a user-space relay adding 10 ms of
RTT; the device is a process in a cgroup v1 CPU quota (default 25 % of one core; ORT on one thread).

The optimiser sees the lab as it is: the device processor is profiled inside that quota, the
server processor (this CPU, one thread by default, unthrottled) is profiled unthrottled; the link is
``--bandwidth-mbps B --rtt-ms 10``. At each bandwidth it makes edgesplit's plan; its baselines
(device-only, server-only, the best single cut, Neurosurgeon-style) are pinned into plans of their
own; every plan is compiled into a bundle and run end to end through the lab.

Goal (issue 5): edgesplit's measured latency at or below the best of the other three at every
bandwidth, within measurement noise.
Run: .venv/bin/python benchmarks/offload_sweep.py [--model resnet18] [--bandwidths 2,10,50,200]
(root: network namespaces and cgroups.)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netlab import CpuQuota, NetLab, serve_command, wait_ready  # noqa: E402

RTT_MS = 10.0
ROOFLINE = {"peak_gflops": 100, "mem_bandwidth_gbps": 10, "launch_overhead_ms": 0.005}

DEVICE_SPEC = """
name: lab-device
kind: device
description: this CPU on one thread, in a {quota}% cgroup v1 CPU quota (the whole process)
local: true
processors:
  cpu:
    kind: cpu
    threads: 1
    peak_gflops: {peak}
    mem_bandwidth_gbps: {bw}
    launch_overhead_ms: {launch}
    active_w: 2.0
    idle_w: 0.5
    backends:
      - runtime: ort
default_link: {{bandwidth_gbps: 8, latency_ms: 0.01}}
"""
# The server as a server (for the plan), and as a local device (to profile its processor here).
SERVER_SPEC = """
name: lab-server
kind: {kind}
description: this CPU, {threads} thread(s), unthrottled, in its own network namespace
local: true
processors:
  cpu:
    kind: cpu
    threads: {threads}
    peak_gflops: {peak}
    mem_bandwidth_gbps: {bw}
    launch_overhead_ms: {launch}
    active_w: 14.0
    idle_w: 5.0
    backends:
      - runtime: ort
default_link: {{bandwidth_gbps: 8, latency_ms: 0.01}}
"""

DEVICE_WORKER = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from edgesplit.runtime.session import load
    for line in sys.stdin:
        job = json.loads(line)
        try:
            remote = {"url": job["url"], "timeout_s": 300, "fallback": False}
            opts = {"remote": remote} if job["url"] else None
            with load(job["bundle"], executor_options=opts) as sess:
                rng = np.random.default_rng(0)
                feeds = {
                    t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in sess.input_specs
                }
                for _ in range(job["warmup"]):
                    sess.run(feeds)
                ms = []
                deadline = time.monotonic() + job["budget_s"]
                while len(ms) < job["runs"] and (len(ms) < 3 or time.monotonic() < deadline):
                    t0 = time.perf_counter()
                    sess.run(feeds)
                    ms.append((time.perf_counter() - t0) * 1e3)
                remote = {k: [v.remote_runs, v.local_runs] for k, v in sess.remote_stats().items()}
            row = {"median_ms": float(np.median(ms)), "runs": len(ms), "remote": remote}
            print(json.dumps(row), flush=True)
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
""")


def edgesplit(*args: str, wrap=None) -> None:
    cmd = [sys.executable, "-m", "edgesplit", *args]
    r = subprocess.run(wrap(cmd) if wrap else cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"edgesplit {' '.join(args)} failed: {r.stderr.strip()}")


def profiles(model: Path, tmp: Path, quota: CpuQuota):
    """The device processor profiled inside the quota, the server's unthrottled, merged."""
    from edgesplit.profile.store import load_profile

    dev_yaml, srv_local_yaml = tmp / "lab-device.yaml", tmp / "lab-server-local.yaml"
    edgesplit(
        "profile",
        str(model),
        "-d",
        str(dev_yaml),
        "-o",
        str(tmp / "dev.json"),
        "-q",
        "--runs",
        "10",
        wrap=quota.wrap,
    )
    edgesplit(
        "profile",
        str(model),
        "-d",
        str(srv_local_yaml),
        "-o",
        str(tmp / "srv.json"),
        "-q",
        "--runs",
        "10",
    )
    dev, srv = load_profile(tmp / "dev.json"), load_profile(tmp / "srv.json")
    renamed = tuple(replace(e, processor=f"lab-server.{e.processor}") for e in srv.entries)
    return replace(dev, entries=dev.entries + renamed)


def pinned(graph, dev, srv, link, prof, assign: dict[str, str]):
    from edgesplit.workflows.resolve import partition

    return partition(graph, dev, profile=prof, server=srv, link=link, pins=assign)


def plans_at(graph, dev, srv, prof, mbps: float) -> dict[str, tuple[object, float]]:
    """name -> (plan, predicted ms) for edgesplit's plan and the three baselines, at ``mbps``."""
    from edgesplit.device.spec import network_link
    from edgesplit.workflows.resolve import partition

    link = network_link(None, bandwidth_mbps=mbps, rtt_ms=RTT_MS)
    plan = partition(graph, dev, profile=prof, server=srv, link=link)
    base = {b.name: b for b in plan.baselines}
    nodes = [n.name for n in graph.nodes]
    out = {"edgesplit": (plan, plan.predicted.latency_ms)}
    for name, key, assign in (
        ("device-only", "only:cpu", dict.fromkeys(nodes, "cpu")),
        ("server-only", "server-only", dict.fromkeys(nodes, "lab-server.cpu")),
    ):
        out[name] = (pinned(graph, dev, srv, link, prof, assign), base[key].latency_ms)
    cut = base["best-single-cut"]
    k = int(re.search(r"nodes \[0, (\d+)\)", cut.assignment_summary).group(1))
    assign = {n: ("cpu" if i < k else "lab-server.cpu") for i, n in enumerate(nodes)}
    out[f"best cut @{k}"] = (pinned(graph, dev, srv, link, prof, assign), cut.latency_ms)
    return out


def signature(plan) -> str:
    return json.dumps(sorted((n, a["processor"]) for n, a in plan.assignment.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--bandwidths", default="2,10,50,200")
    ap.add_argument(
        "--runs", type=int, default=15, help="timed runs per configuration (fewer past --budget-s)"
    )
    ap.add_argument("--budget-s", type=float, default=8.0, help="time per configuration")
    ap.add_argument(
        "--quota-pct", type=float, default=25, help="the device's CPU quota (%% of one core)"
    )
    ap.add_argument(
        "--server-threads",
        type=int,
        default=1,
        help="ORT threads of the server processor (the 2 cores are shared with the device)",
    )
    ap.add_argument(
        "--tolerance", type=float, default=0.10, help="measurement noise allowed in the verdict"
    )
    args = ap.parse_args()
    from edgesplit.device.spec import load_device
    from edgesplit.model import zoo
    from edgesplit.model.load import load_model
    from edgesplit.workflows.compile import compile_bundle

    tmp = Path(tempfile.mkdtemp(prefix="edgesplit-sweep-"))
    peak, bw, launch = (
        ROOFLINE["peak_gflops"],
        ROOFLINE["mem_bandwidth_gbps"],
        ROOFLINE["launch_overhead_ms"],
    )
    (tmp / "lab-device.yaml").write_text(
        DEVICE_SPEC.format(
            quota=args.quota_pct, peak=peak * args.quota_pct / 100, bw=bw, launch=launch
        )
    )
    for kind, name in (("server", "lab-server.yaml"), ("device", "lab-server-local.yaml")):
        (tmp / name).write_text(
            SERVER_SPEC.format(
                kind=kind, peak=peak, bw=bw, launch=launch, threads=args.server_threads
            )
        )
    model = zoo.save(args.model, tmp / f"{args.model}.onnx")
    graph = load_model(model)
    dev, srv = load_device(tmp / "lab-device.yaml"), load_device(tmp / "lab-server.yaml")
    full = dev.with_server(srv)
    rows, bundles = [], {}
    with CpuQuota(args.quota_pct) as quota:
        t0 = time.time()
        prof = profiles(model, tmp, quota)
        print(
            f"profiled {args.model} on the device (in the quota) and the server in "
            f"{time.time() - t0:.0f} s"
        )
        device = subprocess.Popen(
            quota.wrap([sys.executable, "-c", DEVICE_WORKER]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            for mbps in [float(b) for b in args.bandwidths.split(",")]:
                configs = plans_at(graph, dev, srv, prof, mbps)
                measured: dict[str, dict] = {}  # the same assignment is one bundle, measured once
                with NetLab(mbps, RTT_MS) as lab:
                    for name, (plan, predicted) in configs.items():
                        sig = signature(plan)
                        if sig not in bundles:
                            bundles[sig] = tmp / f"bundle{len(bundles)}"
                            compile_bundle(model, plan, bundles[sig], device=full)
                        if sig not in measured:
                            measured[sig] = measure(
                                lab, device, bundles[sig], plan, args, len(rows)
                            )
                        same = next((r[1] for r in rows if r[0] == mbps and r[5] == sig), None)
                        rows.append((mbps, name, predicted, measured[sig], len(plan.parts), sig))
                        print_row(rows[-1], same)
        finally:
            device.stdin.close()
            device.wait(30)
    verdict(rows, args.tolerance)


def measure(lab: NetLab, device: subprocess.Popen, bundle: Path, plan, args, k: int) -> dict:
    url = None
    if any(p.remote for p in plan.parts):
        port = 8000 + k
        lab.spawn(serve_command(bundle, lab.server_ip, port), stderr=subprocess.DEVNULL)
        relay = lab.relay(port)
        url = f"http://127.0.0.1:{relay.port}"
        wait_ready(url)
    job = {
        "bundle": str(bundle),
        "url": url,
        "runs": args.runs,
        "warmup": 2,
        "budget_s": args.budget_s,
    }
    device.stdin.write(json.dumps(job) + "\n")
    device.stdin.flush()
    return json.loads(device.stdout.readline())


def print_row(row, same_as: str | None) -> None:
    mbps, name, predicted, result, n_parts, _ = row
    if "error" in result:
        print(
            f"{mbps:>6g} Mbit/s  {name:<16} predicted {predicted:>9.1f} ms   ERROR "
            f"{result['error']}"
        )
        return
    m = result["median_ms"]
    print(
        f"{mbps:>6g} Mbit/s  {name:<16} parts {n_parts}  predicted {predicted:>9.1f} ms  measured "
        f"{m:>9.1f} ms "
        f"(x{m / predicted:.2f}, {result['runs']} runs)" + (f"  = {same_as}" if same_as else ""),
        flush=True,
    )


def verdict(rows, tolerance: float) -> None:
    print()
    print(
        f"{'Mbit/s':>7}  {'edgesplit':>10}  {'best other':>22}  verdict (tolerance {tolerance:.0%})"
    )
    for mbps in sorted({r[0] for r in rows}):
        here = {r[1]: r[3].get("median_ms") for r in rows if r[0] == mbps}
        ours = here.pop("edgesplit")
        best_name = min(here, key=lambda n: here[n] if here[n] is not None else float("inf"))
        best = here[best_name]
        ok = ours is not None and best is not None and ours <= best * (1 + tolerance)
        print(
            f"{mbps:>7g}  {ours:>8.1f}ms  {best_name:>12} {best:>7.1f}ms  {'ok' if ok else 'WORSE'}"
        )


if __name__ == "__main__":
    main()
