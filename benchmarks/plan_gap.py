"""Why a multi-part plan measures slower than predicted: the gap, accounted for from runtime traces.

For one model on one device (default googlenet on host-biglittle): profile (or reuse a profile),
make the latency plan, and compile three bundles:

- ``plan``: the optimiser's latency plan;
- ``plan-on-big``: the same cut, every part on the first processor (so the cost of cutting alone,
  without a second processor, shows);
- ``big``: the whole model as one part on the first processor.

They run in alternating blocks (``--rounds`` x ``--block`` single requests each) with the
always-on timing records, then once more with detailed traces (ORT's profiler and thread CPU
time). Printed: predicted against measured per variant; the plan's latency along its realised
critical path (run calls against their predictions, hand-offs, queue waits, bookkeeping); inside
the run calls, the fixed cost per run (run call minus kernels), the layout reorders, the little
core's throttling (wall against CPU time in the run calls, and the cgroup's own counters), and
contention (the plan's big parts against the same parts in ``plan-on-big``).

The cgroup that emulates the little core is named after the processor and shared by every
process that runs the device at once; set ``EDGESPLIT_CGROUP_CPU`` to a private hierarchy (say
``/sys/fs/cgroup/cpu/mine``, created first) so that another user's runs do not eat its quota.

Run: .venv/bin/python benchmarks/plan_gap.py [--model googlenet] [--profile P.json] [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgesplit.device.cpu import CGROUP_CPU
from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.optimize.plan import Plan
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import load_profile
from edgesplit.runtime.breakdown import breakdown
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.resolve import partition


def med(values) -> float:
    v = list(values)
    return float(np.median(v)) if v else float("nan")


def cgroup_stat(processor: str) -> dict[str, int]:
    path = CGROUP_CPU / f"edgesplit-{processor}" / "cpu.stat"
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}
    except OSError:
        return {}


def build(args, tmp: Path):
    device = load_device(args.device)
    first = device.processors[0].name
    graph = load_model(zoo.save(args.model, tmp / f"{args.model}.onnx"))
    if args.profile:
        prof = load_profile(args.profile)
    else:
        prof = profile_model(graph, device, ProfileOptions(["ort"], runs=20, warmup=5))
        prof.save(tmp / "profile.json")
    plan = partition(graph, device, profile=prof, objective="latency")
    big = partition(graph, device, profile=prof, pins={n.name: first for n in graph.nodes})
    on_big = copy.deepcopy(plan.to_json())
    for p in on_big["parts"]:
        p["processor"] = first
        p["latency_ms"] = None  # not predicted: the cut alone, on one processor
    for a in on_big["assignment"].values():
        a["processor"] = first
    on_big = Plan.from_json(on_big)
    bundles = {}
    for name, pl in (("plan", plan), ("plan-on-big", on_big), ("big", big)):
        compile_bundle(graph, pl, tmp / name, device=device)
        bundles[name] = tmp / name
    if any(p.cpu_quota_pct for p in device.processors):
        # the same plan with no CPU quota anywhere: what the quota's bursts cost, all else equal
        free = replace(
            device, processors=tuple(replace(p, cpu_quota_pct=None) for p in device.processors)
        )
        compile_bundle(graph, plan, tmp / "plan-no-quota", device=free)
        bundles["plan-no-quota"] = tmp / "plan-no-quota"
    return device, plan, big, bundles


def timed_blocks(bundles, rounds: int, block: int, little: str):
    sessions = {k: load(v) for k, v in bundles.items()}
    feeds = random_feeds(next(iter(sessions.values())))
    lat = defaultdict(list)
    per_round = defaultdict(list)
    throttled = {"periods": 0, "throttled": 0, "time_ns": 0, "requests": 0}
    untimed = defaultdict(set)
    try:
        for s in sessions.values():
            for _ in range(3):
                s.run(feeds)
            s.reset_stats()
        for _ in range(rounds):
            for name, s in sessions.items():
                s.run(feeds)  # the first run of a block meets the previous block's threads
                untimed[name].add(max(r.request for r in s.trace_records().requests))
                before = cgroup_stat(little)
                t = []
                for _ in range(block):
                    t0 = time.perf_counter()
                    s.run(feeds)
                    t.append((time.perf_counter() - t0) * 1e3)
                after = cgroup_stat(little)
                if name == "plan" and before:
                    throttled["periods"] += after["nr_periods"] - before["nr_periods"]
                    throttled["throttled"] += after["nr_throttled"] - before["nr_throttled"]
                    throttled["time_ns"] += after["throttled_time"] - before["throttled_time"]
                    throttled["requests"] += block
                lat[name] += t
                per_round[name].append(med(t))
        singles = {}
        for n, s in sessions.items():
            trace = s.trace_records()
            timed = trace.select(r.request for r in trace.requests if r.request not in untimed[n])
            singles[n] = (timed, breakdown(timed, s.manifest), s.manifest)
    finally:
        for s in sessions.values():
            s.close()
    return lat, per_round, singles, throttled


def detailed_pass(bundles, block: int):
    out = {}
    for name, path in bundles.items():
        with load(path, detailed=True) as s:
            feeds = random_feeds(s)
            for _ in range(3):
                s.run(feeds)
            s.reset_stats()
            for _ in range(block):
                s.run(feeds)
            trace = s.end_detailed_trace()
            out[name] = (trace, breakdown(trace, s.manifest), s.manifest)
    return out


def report_variants(plan, big, lat, per_round) -> None:
    print(
        f"\n{'variant':<13}{'parts':>6}{'predicted ms':>14}{'measured ms':>13}  per-round medians"
    )
    preds = {"plan": plan.predicted.latency_ms, "big": big.predicted.latency_ms}
    for name, t in lat.items():
        p = preds.get(name)
        n = 1 if name == "big" else len(plan.parts)
        rounds = " ".join(f"{v:.1f}" for v in per_round[name])
        print(f"{name:<13}{n:>6}{'-' if p is None else f'{p:.2f}':>14}{med(t):>13.2f}  {rounds}")


def replay(manifest, dur_ms, edge_ms) -> float:
    """The runtime's schedule at part granularity: a part starts when its inputs are there
    (``edge_ms(src, dst)`` after each producer) and its processor is free, first ready first."""
    deps = {a.name: a.depends_on for a in manifest.parts}
    proc = {a.name: a.processor for a in manifest.parts}
    order = {a.name: k for k, a in enumerate(manifest.parts)}
    done: dict[str, float] = {}
    free: dict[str, float] = defaultdict(float)
    pending = set(deps)
    while pending:
        ready = {
            p: max((done[d] + edge_ms(d, p) for d in deps[p]), default=0.0)
            for p in pending
            if all(d in done for d in deps[p])
        }
        p = min(ready, key=lambda q: (ready[q], order[q]))
        start = max(ready[p], free[proc[p]])
        done[p] = free[proc[p]] = start + dur_ms[p]
        pending.remove(p)
    return max(done.values())


def report_path(timed, b, manifest, plan) -> None:
    pred = {p.name: p.latency_ms for p in plan.parts}
    procs = {p.name: p.processor for p in plan.parts}
    paths = [r.path for r in b.requests]
    path_pred = med(sum(pred[n] for n in path) for path in paths)
    on_path = med(len(path) for path in paths)
    print(
        f"\nalong each request's realised critical path (medians over {len(b.requests)} requests):"
    )
    print(f"  latency {b.latency_ms:.2f} ms, predicted {b.predicted_ms:.2f} ms")
    print(
        f"  {on_path:.0f} parts on the path; their run calls {b.critical_run_ms:.2f} ms, "
        f"predicted {path_pred:.2f} ms"
    )
    print(
        f"  not in run calls: {b.unexplained_ms:.2f} ms = hand-offs {b.handoff_ms:.2f} + queue "
        "waits "
        f"{b.queue_ms:.2f} + inputs/outputs {b.io_ms:.2f} + bookkeeping {b.bookkeeping_ms:.2f} "
        f"+ other {b.other_ms:.2f}"
    )
    runs = {(p.request, p.part): p for p in timed.parts}
    for lane in sorted(set(procs.values())):
        per_req, each = [], []
        for r in b.requests:
            mine = [runs[(r.request, n)] for n in r.path if procs[n] == lane]
            h = [x.queue_wait_ns / 1e6 for x in mine if x.worker_idle]
            per_req.append(sum(h))
            each += h
        if each:
            print(
                f"  hand-offs onto {lane} on the path: {len(each) / len(b.requests):.1f} per "
                "request, "
                f"{med(per_req):.2f} ms per request; each: median {med(each):.3f} ms, "
                f"p90 {np.percentile(each, 90):.3f}, max {max(each):.3f}"
            )
    waits = [p for p in b.parts if p.queue_wait_ms > 0.2 and p.handoff_ms is None]
    if waits:
        print(
            "  parts that waited for a busy processor: "
            + ", ".join(f"{p.part} {p.queue_wait_ms:.2f}" for p in waits)
        )
    busy = ", ".join(f"{p.lane} {p.utilisation:.0%}" for p in b.processors)
    print(f"  processors busy in run calls while requests ran: {busy}")
    report_steps(b, manifest, plan)


def report_steps(b, manifest, plan) -> None:
    """From the node-level prediction to the measurement, one substitution at a time."""
    pred = {p.name: p.latency_ms for p in plan.parts}
    procs = {p.name: p.processor for p in plan.parts}
    edges = defaultdict(float)
    for t in plan.transfers:
        edges[(t.src_part, t.dst_part)] += t.latency_ms
    by = {p.part: p for p in b.parts}
    lane_handoff = defaultdict(list)
    for p in b.parts:
        if p.handoff_ms is not None:
            lane_handoff[p.processor].append(p.handoff_ms)
    lane_med = {k: med(v) for k, v in lane_handoff.items()}

    def handoff(src: str, dst: str) -> float:
        h = by[dst].handoff_ms
        return h if h is not None else lane_med.get(procs[dst], 0.0)

    steps = [
        ("the plan's prediction (part-level schedule)", plan.predicted.latency_ms),
        (
            "part-level replay, predicted part times + transfers",
            replay(manifest, pred, lambda s, d: edges[(s, d)]),
        ),
        (
            "  ... with measured run calls",
            replay(manifest, {p.part: p.run_ms for p in b.parts}, lambda s, d: edges[(s, d)]),
        ),
        (
            "  ... + measured in-worker overhead and hand-offs",
            replay(manifest, {p.part: p.span_ms for p in b.parts}, handoff),
        ),
        ("measured (median)", b.latency_ms),
    ]
    print("  the gap, step by step (ms):")
    for label, v in steps:
        print(f"    {label:<55}{v:8.2f}")


def report_inside(detail, plan, throttled) -> None:
    trace, b, manifest = detail["plan"]
    _, b_on_big, _ = detail["plan-on-big"]
    _, b_big, _ = detail["big"]
    procs = {p.name: p.processor for p in plan.parts}
    print(
        "\ninside the run calls (detailed trace, medians per part; profiling slows runs a little):"
    )
    for name, bb in (("plan", b), ("plan-on-big", b_on_big), ("big", b_big)):
        run = sum(p.run_ms for p in bb.parts)
        kern = sum(p.kernels_ms or 0 for p in bb.parts)
        eng = sum(p.engine_ms or 0 for p in bb.parts)
        reo = sum(p.reorder_ms or 0 for p in bb.parts)
        nreo = sum(p.reorders or 0 for p in bb.parts)
        print(
            f"  {name:<12} {len(bb.parts):>3} parts: run calls {run:7.2f} ms, engine {eng:7.2f}, "
            f"kernels {kern:7.2f}; "
            f"fixed cost per run (run call - kernels) {(run - kern) / len(bb.parts):.3f} ms; "
            f"{nreo} reorder kernels {reo:.2f} ms"
        )
    fixed = [(p.run_ms - (p.kernels_ms or 0)) for p in b_on_big.parts]
    print(
        f"  plan-on-big per part: run call - kernels median {med(fixed):.3f} ms (range "
        f"{min(fixed):.3f}-{max(fixed):.3f})"
    )
    outside = [p.run_ms - (p.engine_ms or 0) for p in b_on_big.parts]
    print(
        "    of which outside ORT's model_run (binding, outputs to numpy): median "
        f"{med(outside):.3f} ms"
    )
    reo = [p.reorder_ms / p.reorders for p in b_on_big.parts if p.reorders]
    if reo:
        print(
            f"  a reorder kernel: median {med(reo):.3f} ms (range {min(reo):.3f}-{max(reo):.3f}), "
            f"{sum(p.reorders for p in b_on_big.parts if p.reorders)} per request in plan-on-big"
        )
    on_big = {p.part: p for p in b_on_big.parts}
    for lane in sorted(set(procs.values())):
        mine = [p for p in b.parts if procs[p.part] == lane]
        k_here = sum(p.kernels_ms or 0 for p in mine)
        k_big = sum(on_big[p.part].kernels_ms or 0 for p in mine)
        wall = sum(p.run_ms for p in mine)
        cpu = sum(p.run_cpu_ms or 0 for p in mine)
        print(
            f"  {lane}: {len(mine)} parts, kernels {k_here:.2f} ms here vs {k_big:.2f} ms for the "
            "same parts alone on "
            f"big ({k_here / k_big if k_big else float('nan'):.2f}x); run calls wall {wall:.2f} ms "
            f"vs thread CPU {cpu:.2f} ms"
        )
    if throttled["requests"]:
        n = throttled["requests"]
        print(
            f"  little's cgroup during the plan's timed blocks: {throttled['throttled'] / n:.1f} "
            "of "
            f"{throttled['periods'] / n:.1f} periods throttled per request, "
            f"{throttled['time_ns'] / n / 1e6:.2f} ms "
            f"throttled per request"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="googlenet")
    ap.add_argument("--device", default="host-biglittle")
    ap.add_argument("--profile", default=None, help="Reuse this profile (default: profile now).")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--keep", default=None, help="Keep the bundles (and profile) in this folder.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(args.keep) if args.keep else Path(tmpdir)
        tmp.mkdir(parents=True, exist_ok=True)
        device, plan, big, bundles = build(args, tmp)
        little = device.processors[-1].name
        print(
            f"{args.model} on {device.name}: plan of {len(plan.parts)} parts; cgroups under "
            f"{CGROUP_CPU}"
        )
        lat, per_round, singles, throttled = timed_blocks(bundles, args.rounds, args.block, little)
        detail = detailed_pass(bundles, args.block)
    report_variants(plan, big, lat, per_round)
    report_path(*singles["plan"], plan)
    if "plan-no-quota" in singles:
        print("\nthe same for plan-no-quota (the plan with no CPU quota on any processor):", end="")
        report_path(*singles["plan-no-quota"], plan)
    report_inside(detail, plan, throttled)


if __name__ == "__main__":
    main()
