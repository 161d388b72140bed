"""The closed loop: how many ``calibrate`` rounds until the plan is predicted within 5%, and whether
the calibrated terms also predict the model's *other* plans better (fitted terms, not memorised
parts).

For one model on one device (default googlenet on host-biglittle): profile (or reuse a profile),
then make several plans with it: the latency plan, each processor alone, the energy plan, and a
split plan (the last third of the model pinned to the last processor) that gives calibration parts
on every processor. All are compiled and measured in alternating blocks. ``calibrate`` runs on the
split plan's bundle; then every plan is predicted again with the calibrated profile, measured
again (alternating), and the latency plan is re-made from the calibrated profile and measured too.

Printed: the calibration rounds (prediction made before each round against its fresh runs), and
per plan the error before and after against the same measurements. The machine may be shared:
figures are noisy, so repeat and report ranges.

Run: .venv/bin/python benchmarks/calibrate_rounds.py [--model googlenet] [--profile P.json] [--runs
20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import load_profile
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.refit import plan_costs, refit
from edgesplit.workflows.resolve import partition


def measure_all(bundles: dict[str, Path], rounds: int, block: int) -> dict[str, float]:
    """Median latency of each bundle, alternating blocks so that drift cancels."""
    sessions = {k: load(v) for k, v in bundles.items()}
    times: dict[str, list[float]] = {k: [] for k in bundles}
    try:
        feeds = random_feeds(next(iter(sessions.values())))
        for s in sessions.values():
            for _ in range(3):
                s.run(feeds)
        for _ in range(rounds):
            for k, s in sessions.items():
                s.run(feeds)
                for _ in range(block):
                    t0 = time.perf_counter()
                    s.run(feeds)
                    times[k].append((time.perf_counter() - t0) * 1e3)
    finally:
        for s in sessions.values():
            s.close()
    return {k: float(np.median(v)) for k, v in times.items()}


def predicted(profile, plan) -> float:
    """The plan's latency under ``profile``, with its own parts and backends."""
    return plan_costs(plan, profile).latency_ms()


def make_plans(graph, device, profile_path):
    procs = [p.name for p in device.processors]
    plans = {"latency": partition(graph, device, profile=profile_path)}
    for p in procs:
        plans[f"only:{p}"] = partition(
            graph, device, profile=profile_path, pins={n.name: p for n in graph.nodes}
        )
    plans["energy"] = partition(graph, device, profile=profile_path, objective="energy")
    cut = 2 * len(graph.nodes) // 3
    pins = {n.name: procs[0] if i < cut else procs[-1] for i, n in enumerate(graph.nodes)}
    plans["split"] = partition(graph, device, profile=profile_path, pins=pins)
    return plans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="googlenet")
    ap.add_argument("--device", default="host-biglittle")
    ap.add_argument("--profile", default=None, help="Reuse this profile (default: profile now).")
    ap.add_argument("--runs", type=int, default=20, help="Timed runs per calibration round.")
    ap.add_argument("--rounds", type=int, default=3, help="Refit rounds at most.")
    ap.add_argument("--blocks", type=int, default=4, help="Alternating measurement rounds.")
    ap.add_argument("--block", type=int, default=8)
    args = ap.parse_args()
    device = load_device(args.device)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        graph = load_model(zoo.save(args.model, tmp / f"{args.model}.onnx"))
        profile_path = args.profile or str(tmp / "profile.json")
        if not args.profile:
            profile_model(graph, device, ProfileOptions(["ort"], runs=20, warmup=5)).save(
                profile_path
            )
        base = load_profile(profile_path)
        plans = make_plans(graph, device, profile_path)
        bundles = {}
        for name, plan in plans.items():
            bundles[name] = tmp / name.replace(":", "_")
            compile_bundle(graph, plan, bundles[name], device=device)
        before = measure_all(bundles, args.blocks, args.block)
        result = refit(
            bundles["split"],
            runs=args.runs,
            max_rounds=args.rounds,
            progress=lambda m: print("  " + m),
        )
        cal_path = tmp / "calibrated.json"
        result.profile.save(cal_path)
        replanned = partition(graph, device, profile=str(cal_path))
        bundles["latency (calibrated)"] = tmp / "latency-calibrated"
        compile_bundle(graph, replanned, bundles["latency (calibrated)"], device=device)
        plans["latency (calibrated)"] = replanned
        after = measure_all(bundles, args.blocks, args.block)
        # predicted while the model file is still there (a plan is priced from its model)
        print(
            f"\n{args.model} on {device.name}: calibrated on the split plan "
            f"({len(plans['split'].parts)} parts)"
        )
        print(
            f"converged after {result.converged_after} round(s) of fitting (tolerance "
            f"{result.tolerance:.0%})"
        )
        print(
            f"\n{'plan':<22}{'parts':>6}{'pred. before':>13}{'pred. after':>12}{'measured':>10}"
            f"{'err before':>11}{'err after':>10}"
        )
        for name, plan in plans.items():
            p0 = predicted(base, plan) if name in before else float("nan")
            p1 = predicted(result.profile, plan)
            m = after[name]
            m0 = before.get(name, m)
            print(
                f"{name:<22}{len(plan.parts):>6}{p0:>13.2f}{p1:>12.2f}{m:>10.2f}"
                f"{(m0 / p0 - 1) if name in before else float('nan'):>+11.1%}{m / p1 - 1:>+10.1%}"
            )


if __name__ == "__main__":
    main()
