"""Adaptive bundles on a really shaped link: band plans switched at run time, against fixed plans.

The lab of ``benchmarks/offload_sweep.py`` (tests/netlab.py): ``edgesplit serve`` in a network
namespace behind a veth pair shaped by ``tc tbf``, 10 ms of RTT from a user-space relay, and a
device process in a cgroup v1 CPU quota (default 25 % of one core). The device and server
processors are profiled as they are in the lab; the plan is made at 10 Mbit/s and compiled as an
adaptive bundle (a plan per bandwidth band, shared parts once). One server serves every part.

Then a bandwidth trace steps through DADS's presets (Wi-Fi 18.88, 4G 5.85, 3G 1.1, CAT1 0.13
Mbit/s) and Wi-Fi/5G-class rates (50, 100, 300). At each step it measures:

* adaptive: one ``BandSession`` kept over the whole trace (it does not know the rate; it measures
  it), ``--requests`` requests a few hundred ms apart; the median of the requests after the first
  three (the switch) and the first three themselves;
* each fixed band plan (skipped, and marked, where its predicted latency passes ``--skip-over-s``:
  at 0.13 Mbit/s an image takes half a minute to send);
* the oracle: the band plan the table gives for the rate the lab sets, measured.

The adaptive session's idle-link probes are paused while the fixed plans run (they would share
the link with them), and start again with its next step, their interval running from then.

Every configuration runs its requests ``GAP_S`` apart (a stream of a few frames a second), so that
all see the same link and CPU-quota state between requests (an idle TCP connection restarts slow).

Run (root: network namespaces and cgroups):
  .venv/bin/python benchmarks/adaptive_sweep.py [--model resnet18] [--trace 18.88,5.85,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from netlab import CpuQuota, NetLab, serve_command, wait_ready  # noqa: E402
from offload_sweep import DEVICE_SPEC, ROOFLINE, RTT_MS, SERVER_SPEC, profiles  # noqa: E402

TRACE = "18.88,5.85,1.1,0.13,50,100,300"
GAP_S = 0.3  # between requests, for every configuration alike: a stream of a few frames a second

WORKER = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from edgesplit.runtime.bands import load_bands
    from edgesplit.runtime.session import load
    bands = None
    for line in sys.stdin:
        job = json.loads(line)
        try:
            opts = {"remote": {"url": job["url"], "timeout_s": 120}}
            if job["kind"] == "adaptive":
                if bands is None:
                    bands = load_bands(job["bundle"], executor_options=opts, probe_interval_s=0.2,
                                       max_probe_interval_s=2.0)
                bands.pause_probes(False)
                sess, run = bands, bands.run
            else:
                sess = load(job["bundle"], executor_options=opts, band_plan=job["plan"])
                run = sess.run
            rng = np.random.default_rng(0)
            feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in sess.input_specs}
            for _ in range(job.get("warmup", 0)):
                run(feeds)
            ms, plans = [], []
            deadline = time.monotonic() + job["budget_s"]
            while len(ms) < job["runs"] and (len(ms) < 2 or time.monotonic() < deadline):
                t0 = time.perf_counter()
                run(feeds)
                ms.append((time.perf_counter() - t0) * 1e3)
                plans.append(getattr(sess, "last_plan", job.get("plan")))
                time.sleep(job.get("gap_s", 0))
            extra = {}
            if job["kind"] == "adaptive":
                bands.pause_probes()  # leave the link to the fixed plans measured next
                st = bands.stats()
                extra = {"uplink_mbps": st.uplink_mbps, "switches": len(st.switches),
                         "decision_us_median": st.decision_us_median,
                         "decision_us_p99": st.decision_us_p99}
            else:
                sess.close()
            print(json.dumps({"ms": ms, "plans": plans, **extra}), flush=True)
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
""")


class Device:
    """The device worker process, inside the CPU quota."""

    def __init__(self, quota: CpuQuota):
        self.proc = subprocess.Popen(
            quota.wrap([sys.executable, "-c", WORKER]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def job(self, **job) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def build(args, tmp: Path, quota: CpuQuota):
    """The lab's specs, the measured profile, and the adaptive bundle; returns (bundle,
    manifest)."""
    from edgesplit.device.spec import load_device, network_link
    from edgesplit.model import zoo
    from edgesplit.optimize.planner import solve_plan
    from edgesplit.workflows.compile import compile_bundle
    from edgesplit.workflows.resolve import Choices, resolve

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
            SERVER_SPEC.format(kind=kind, peak=peak, bw=bw, launch=launch, threads=1)
        )
    model = zoo.save(args.model, tmp / f"{args.model}.onnx")
    t0 = time.time()
    prof = profiles(model, tmp, quota)
    dev, srv = load_device(tmp / "lab-device.yaml"), load_device(tmp / "lab-server.yaml")
    link = network_link(None, bandwidth_mbps=10.0, rtt_ms=RTT_MS)
    problem = resolve(model, dev, Choices(profile=prof, server=srv, link=link))
    plan = solve_plan(problem)
    manifest = compile_bundle(
        problem.graph, plan, tmp / "bundle", device=problem.full_device, problem=problem
    )
    print(f"profiled and compiled {args.model} in {time.time() - t0:.0f} s")
    return tmp / "bundle", manifest, problem


def predicted_ms(problem, bands, rates: list[float]) -> list[list[float]]:
    """Per band plan of the bundle, the predicted latency at each rate (ms)."""
    from edgesplit.optimize.bands import curves, plan_assignment, problem_pricings

    # each plan in the cheaper of the pricings the band table weighed (each node on its fastest
    # backend, or one backend per processor): the one the table chose it in
    pricings = problem_pricings(problem)
    assigns = [plan_assignment(pricings[0], bp.plan) for bp in bands.plans]
    each = [curves(cm, bands.objective, assigns, rates) for cm in pricings]
    return [[min(v) for v in zip(*per_pricing)] for per_pricing in zip(*each)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--trace", default=TRACE, help="uplink rates (Mbit/s), in order")
    ap.add_argument("--requests", type=int, default=8, help="adaptive requests per step")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per fixed plan and step")
    ap.add_argument("--budget-s", type=float, default=8.0, help="time per fixed plan and step")
    ap.add_argument(
        "--skip-over-s", type=float, default=6.0, help="do not run fixed plans predicted slower"
    )
    ap.add_argument("--quota-pct", type=float, default=25)
    args = ap.parse_args()
    rates = [float(x) for x in args.trace.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="edgesplit-adaptive-"))
    with CpuQuota(args.quota_pct) as quota:
        bundle, manifest, problem = build(args, tmp, quota)
        bands = manifest.bands
        if bands is None or not any(p.remote for p in manifest.parts):
            print(
                "the band table has no plan with a server part (the device is as fast as the server"
            )
            print(
                "as measured here; on a loaded machine, try a smaller --quota-pct): nothing to "
                "switch"
            )
            return
        print_table(bands)
        with NetLab(rates[0], RTT_MS) as lab:
            lab.spawn(serve_command(bundle, lab.server_ip, 8000), stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{lab.relay(8000).port}"
            wait_ready(url)
            device = Device(quota)
            lab._procs.append(device.proc)  # stopped with the lab, even on failure
            try:
                rows = trace(args, rates, lab, device, str(bundle), url, bands, problem)
            finally:
                device.close()
    summary(rows, len(bands.plans))


def trace(args, rates, lab, device, bundle, url, bands, problem) -> list[dict]:
    pred = predicted_ms(problem, bands, rates)
    rows = []
    for i, rate in enumerate(rates):
        lab.set_rate(rate)
        ad = device.job(
            kind="adaptive", bundle=bundle, url=url, runs=args.requests, budget_s=1e9, gap_s=GAP_S
        )
        fixed = {}
        for k in range(len(bands.plans)):
            if pred[k][i] > args.skip_over_s * 1e3:
                fixed[k] = None
                continue
            r = device.job(
                kind="fixed",
                bundle=bundle,
                url=url,
                plan=k,
                runs=args.runs,
                budget_s=args.budget_s,
                warmup=1,
                gap_s=GAP_S,
            )
            fixed[k] = statistics.median(r["ms"]) if "ms" in r else None
        row = {
            "rate": rate,
            "adaptive": ad,
            "fixed": fixed,
            "oracle": bands.plan_at(rate),
            "pred": [p[i] for p in pred],
        }
        rows.append(row)
        print_row(row)
    return rows


def print_table(bands) -> None:
    print(
        "band table: "
        + ", ".join(f"{b['lo_mbps']:.3g}-{b['hi_mbps']:.3g}: plan {b['plan']}" for b in bands.bands)
    )
    for k, bp in enumerate(bands.plans):
        print(f"  plan {k}: " + " ".join(f"{p.processor}:{len(p.nodes)}" for p in bp.plan.parts))


def print_row(row: dict) -> None:
    ad = row["adaptive"]
    if "error" in ad:
        print(f"{row['rate']:>7g} Mbit/s  adaptive ERROR {ad['error']}")
        return
    after = statistics.median(ad["ms"][3:]) if len(ad["ms"]) > 3 else float("nan")
    fixed = "  ".join(
        f"plan {k} {'-' if v is None else f'{v:.0f}'}" for k, v in row["fixed"].items()
    )
    print(
        f"{row['rate']:>7g} Mbit/s  adaptive {after:>7.0f} ms (first 3: "
        f"{', '.join(f'{x:.0f}' for x in ad['ms'][:3])}; "
        f"plans {ad['plans']}; est {ad.get('uplink_mbps') or 0:.3g} Mbit/s)  {fixed}  oracle plan "
        f"{row['oracle']}",
        flush=True,
    )


def summary(rows: list[dict], n_plans: int) -> None:
    print()
    print(f"{'Mbit/s':>7}  {'adaptive':>9}  {'oracle':>9}  {'best fixed':>10}  adaptive/oracle")
    tot_ad, tot_fixed = 0.0, [0.0] * n_plans
    for r in rows:
        ad = r["adaptive"].get("ms", [])
        after = statistics.median(ad[3:]) if len(ad) > 3 else float("nan")
        oracle = r["fixed"].get(r["oracle"])
        best = min((v for v in r["fixed"].values() if v is not None), default=float("nan"))
        ratio = after / oracle if oracle else float("nan")
        print(
            f"{r['rate']:>7g}  {after:>7.0f}ms  {oracle or float('nan'):>7.0f}ms  {best:>8.0f}ms  "
            f"{ratio:.2f}"
        )
        tot_ad += sum(ad)
        for k in range(n_plans):
            v = r["fixed"].get(k)
            # a skipped plan is charged its prediction for the same number of requests
            tot_fixed[k] += (v if v is not None else r["pred"][k]) * len(ad)
    print(
        f"whole trace, {sum(len(r['adaptive'].get('ms', [])) for r in rows)} requests: adaptive "
        f"{tot_ad / 1e3:.1f}"
        " "
        "s; "
        + ", ".join(f"fixed plan {k} {t / 1e3:.1f} s" for k, t in enumerate(tot_fixed))
        + " (fixed plans: measured medians, predicted where skipped)"
    )


if __name__ == "__main__":
    main()
