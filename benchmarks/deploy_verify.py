"""Does ``deploy``'s verification keep its promise? Deploy zoo models, then measure the shipped
bundle against every candidate again (alternating, in rounds) and check issue 10's statements:

1. the shipped bundle measures at most 1.02x the best measured baseline, in every case;
2. googlenet on ``host-biglittle``: the latency bundle ``deploy`` ships is no slower than big alone;
3. on ``host``: for every zoo model, the shipped bundle is no slower than whole-model ONNX Runtime
   with the same threads (``only:cpu``; at most 1.02x).

The re-measurement is independent of the verdict: new Sessions, new rounds. "Baselines" are every
candidate but the optimiser's plan (``only:*``, ``best-single-cut``, ``server-only``); a shipped
baseline counts among them. Profiles are measured with every backend the device offers (what a
user of ``deploy`` gets) and kept in ``--work`` so that a rerun measures only the bundles.

Run: .venv/bin/python benchmarks/deploy_verify.py [--cases host:squeezenet,host-biglittle:googlenet]
     [--budget-s 30] [--max-load 1.5] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

import edgesplit
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.workflows.verify import VerifyOptions
from edgesplit.workflows.verify.measure import measure

LIMIT = 1.02


def default_cases() -> list[tuple[str, str]]:
    return [("host", m) for m in zoo.names()] + [("host-biglittle", "googlenet")]


def wait_for_load(max_load: float | None, timeout_s: float = 600.0) -> float:
    """Wait (up to ``timeout_s``) until the 1-minute load average is below ``max_load``."""
    t0 = time.time()
    while max_load is not None and os.getloadavg()[0] > max_load and time.time() - t0 < timeout_s:
        time.sleep(10)
    return os.getloadavg()[0]


def profile_for(work: Path, model: Path, device: str) -> Path:
    path = work / f"{model.stem}.{device}.profile.json"
    if not path.is_file():
        prof = profile_model(
            load_model(str(model)), edgesplit.load_device(device), ProfileOptions()
        )
        prof.save(path)
    return path


def recheck(out: Path, kept: Path, shipped: str, budget_s: float) -> dict[str, float]:
    """Median ms per bundle: the shipped one and every other kept candidate, alternating again."""
    bundles = {"shipped": out}
    for d in sorted(kept.iterdir()):
        man = edgesplit.open_bundle(d)
        name = (
            man.plan.solver.name.removeprefix("baseline:")
            if man.plan.solver.name.startswith("baseline:")
            else "plan"
        )
        if name != shipped:
            bundles[name] = d
    meas = measure(bundles, "latency", budget_s)
    if meas.short:
        print(f"  recheck: {meas.short}")
    return {n: float(np.median(v)) for n, v in meas.rounds_ms.items()}


def run_case(work: Path, device: str, name: str, budget_s: float, recheck_s: float) -> dict:
    model = (
        zoo.save(name, work / f"{name}.onnx")
        if not (work / f"{name}.onnx").is_file()
        else work / f"{name}.onnx"
    )
    prof = profile_for(work, model, device)
    out, kept = work / f"{name}.{device}.bundle", work / f"{name}.{device}.candidates"
    shutil.rmtree(kept, ignore_errors=True)
    t0 = time.perf_counter()
    options = VerifyOptions(budget_s=budget_s, keep_candidates=kept)
    manifest = edgesplit.deploy(model, device, out, profile=prof, verify_options=options)
    deploy_s = time.perf_counter() - t0
    v = manifest.verification
    kept.mkdir(exist_ok=True)
    medians = recheck(out, kept, v.shipped, recheck_s)
    shipped_ms = medians.get("shipped")

    def median_of(cand: str) -> float | None:
        twin = v.candidate(cand).same_as or cand  # identical bundles were built and measured once
        return shipped_ms if twin == v.shipped else medians.get(twin)

    baselines = {c.name: median_of(c.name) for c in v.candidates[1:] if c.error is None}
    baselines = {n: ms for n, ms in baselines.items() if ms is not None}
    best = min(baselines, key=baselines.get) if baselines else None
    single = "only:cpu" if device == "host" else "only:big"
    single_ms = median_of(single) if single in {c.name for c in v.candidates} else None
    return {
        "device": device,
        "model": name,
        "shipped": v.shipped,
        "reason": v.reason,
        "parts": len(manifest.parts),
        "plan_parts": v.candidate("plan").n_parts,
        "shipped_ms": shipped_ms,
        "best_baseline": best,
        "best_baseline_ms": baselines.get(best),
        "ratio_to_best_baseline": shipped_ms / baselines[best] if best and shipped_ms else None,
        "plan_ms": shipped_ms if v.shipped == "plan" else median_of("plan"),
        "single": single,
        "ratio_to_single": shipped_ms / single_ms if single_ms and shipped_ms else None,
        "verify_rounds": v.rounds,
        "verify_measure_s": v.measure_s,
        "verify_compile_s": v.compile_s,
        "deploy_s": round(deploy_s, 1),
        "load_1min": os.getloadavg()[0],
        "remeasured_ms": medians,
    }


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def summary(rows: list[dict]) -> None:
    ok1 = [r for r in rows if r["ratio_to_best_baseline"] is not None]
    n1 = sum(r["ratio_to_best_baseline"] <= LIMIT for r in ok1)
    print(f"\n1. shipped <= {LIMIT}x the best measured baseline: {n1}/{len(ok1)} cases")
    for r in rows:
        if r["device"] == "host-biglittle" and r["model"] == "googlenet":
            print(
                f"2. googlenet on host-biglittle, shipped / big alone: {fmt(r['ratio_to_single'])}"
            )
    host = [r for r in rows if r["device"] == "host" and r["ratio_to_single"] is not None]
    n3 = sum(r["ratio_to_single"] <= LIMIT for r in host)
    print(f"3. host, shipped <= {LIMIT}x whole-model ORT (only:cpu): {n3}/{len(host)} models")
    for r in rows:
        if r["ratio_to_best_baseline"] is None:
            print(f"   not re-measured: {r['device']} {r['model']} (deploy: {r['reason']})")
    kept = sum(r["shipped"] == "plan" for r in rows)
    print(f"   the optimiser's plan was shipped in {kept}/{len(rows)} cases")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--cases",
        help="DEVICE:MODEL,... (default: every zoo model on host, googlenet on host-biglittle)",
    )
    ap.add_argument("--budget-s", type=float, default=30.0, help="deploy's verification budget")
    ap.add_argument(
        "--recheck-budget-s", type=float, default=60.0, help="the re-measurement's budget"
    )
    ap.add_argument(
        "--max-load", type=float, default=None, help="wait for a 1-minute load below this"
    )
    ap.add_argument("--work", default="out/deploy_verify", help="models, profiles and bundles")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    cases = (
        [tuple(c.split(":", 1)) for c in args.cases.split(",")] if args.cases else default_cases()
    )
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    head = f"{'device':<15}{'model':<18}{'shipped':<18}{'parts':>6}{'shipped ms':>12}"
    print(
        head + f"{'best baseline':>22}{'its ms':>10}{'ratio':>8}{'vs single':>10}{'plan ms':>10}"
        f"{'load':>6}"
    )
    rows = []
    for device, name in cases:
        wait_for_load(args.max_load)
        try:
            r = run_case(work, device, name, args.budget_s, args.recheck_budget_s)
        except edgesplit.EdgesplitError as e:
            print(f"{device:<15}{name:<18}failed: {e}")
            continue
        rows.append(r)
        print(
            f"{device:<15}{name:<18}{r['shipped']:<18}{r['parts']:>6}{fmt(r['shipped_ms']):>12}"
            f"{r['best_baseline'] or '-':>22}{fmt(r['best_baseline_ms']):>10}"
            f"{fmt(r['ratio_to_best_baseline']):>8}{fmt(r['ratio_to_single']):>10}{fmt(r['plan_ms']):>10}"
            f"{r['load_1min']:>6.1f}",
            flush=True,
        )
    summary(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
