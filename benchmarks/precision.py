"""int8 on host-npu, measured: latency and accuracy of fp32, int8 wherever allowed, and the plans.

For resnet18 and mobilenetv2 from the zoo (seeded weights: their accuracy figures only stress the
mechanism) and PP-OCRv4 det (trained weights, from the rapidocr-onnxruntime wheel), on
``devices/host-npu.yaml`` (core 0 fp32 ORT, core 1 int8 QDQ ORT with the Ethos-U operator set):

- ``fp32``: every node on ``cpu``;
- ``int8-max``: every node the allowlist allows on ``npu`` in int8, the rest on ``cpu``;
- ``plan-loose`` / ``plan-tight``: edgesplit's latency plan under a loose and a tight SNR budget;
- ``shipped-loose`` / ``shipped-tight``: what ``deploy`` ships for that plan: its verification
  (:func:`edgesplit.workflows.verify.verify_plan`, the same candidates, accuracy check and
  measurement)
  holds every candidate with int8 parts to the budget and ships the best measured one that meets
  it (the plan, ``only:cpu``, or ``only:npu`` where every op runs there). The row names it.

Each is compiled to a bundle and run through the runtime (median of ``--runs`` requests, the
candidates timed in turn so that they share the machine's load), and its
accuracy against fp32 is measured by running the bundle on the held-out calibration samples
(``skimage.data`` photographs). A candidate is on the frontier when no other is both faster and
more accurate; the frontier is judged twice: among fp32, int8-max and the raw plans (``raw``), and
among fp32, int8-max and the shipped bundles (``shipped``), which is what a user gets. Also
printed: the profiled int8-against-fp32 speedup per op type (sums of the nodes' measured costs on
``npu`` and on ``cpu``). Run alone on the machine: timings taken while others run are noisy.

    python benchmarks/precision.py [--runs 30] [--det-size 640] [--models
    resnet18,mobilenetv2,ppocrv4-det]
        [--calibration-method minmax] [--verify-budget-s 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import edgesplit
from edgesplit.model import zoo
from edgesplit.model.calibration_data import calibration_set
from edgesplit.optimize.planner import solve_plan
from edgesplit.precision import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD
from edgesplit.precision.metrics import SNR_CAP_DB, AccuracyBudget
from edgesplit.runtime.accuracy import bundle_accuracy
from edgesplit.workflows.resolve import Choices, resolve
from edgesplit.workflows.verify import VerifyOptions, verify_plan

DEVICE = "host-npu"
BUDGETS = {"loose": AccuracyBudget(min_snr_db=15.0), "tight": AccuracyBudget(min_snr_db=30.0)}
ANY = AccuracyBudget(min_snr_db=-SNR_CAP_DB)
RAW = ("fp32", "int8-max", "plan-loose", "plan-tight")
SHIPPED = ("fp32", "int8-max", "shipped-loose", "shipped-tight")


def models(tmp: Path, det_size: int) -> list[tuple[str, str, dict | None, str]]:
    import importlib.util

    out = [
        (n, str(zoo.save(n, tmp / f"{n}.onnx")), None, "zoo, seeded weights")
        for n in ("resnet18", "mobilenetv2")
    ]
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec and spec.submodule_search_locations:
        det = sorted(
            (Path(next(iter(spec.submodule_search_locations))) / "models").glob("*det*.onnx")
        )
        if det:
            out.append(
                (
                    "ppocrv4-det",
                    str(det[0]),
                    {"x": (1, 3, det_size, det_size)},
                    "trained (rapidocr wheel)",
                )
            )
    return out


def speedups(graph, profile) -> dict[str, tuple[float, float]]:
    cpu, npu = profile.entry("cpu", "ort"), profile.entry("npu", "ort-int8")
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for n in graph.nodes:
        if n.name in npu.nodes:
            by[n.op_type][0] += cpu.nodes[n.name].latency_ms
            by[n.op_type][1] += npu.nodes[n.name].latency_ms
    return {op: (a, b) for op, (a, b) in by.items()}


def timed(graph, bundles: dict[str, Path], runs: int) -> dict[str, float]:
    """Median ms per bundle, timed round-robin (one request each in turn), so that every candidate
    sees the same load from the rest of the machine."""
    x = dict(calibration_set(graph).held_out[0])
    with contextlib.ExitStack() as stack:
        sessions = {k: stack.enter_context(edgesplit.load(b)) for k, b in bundles.items()}
        times: dict[str, list[float]] = {k: [] for k in bundles}
        for r in range(runs + 3):
            for k, session in sessions.items():
                t0 = time.perf_counter()
                session.run(x)
                if r >= 3:  # warm-up
                    times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(t) for k, t in times.items()}


def candidates(graph, profile, method: str) -> tuple[dict[str, object], dict[str, object]]:
    """The candidates' plans, and the problem each budget's plan was made from (for verify)."""
    device = edgesplit.load_device(DEVICE)
    npu = device.processor("npu")
    on_cpu = {n.name: "cpu" for n in graph.nodes}
    allowed = {n.name: ("npu" if npu.supports(n.op_type) else "cpu") for n in graph.nodes}

    def problem(**choices):
        return resolve(
            graph, DEVICE, Choices(profile=profile, calibration_method=method, **choices)
        )

    problems = {
        "fp32": problem(pins=on_cpu),
        "int8-max": problem(pins=allowed, accuracy=ANY),
        **{f"plan-{k}": problem(accuracy=b) for k, b in BUDGETS.items()},
    }
    return {k: solve_plan(p) for k, p in problems.items()}, problems


def shipped(problem, plan, out: Path, budget_s: float) -> str:
    """Verify ``plan`` as ``deploy`` does and write what it ships at ``out``; the shipped
    candidate's name."""
    m = verify_plan(problem, plan, out, options=VerifyOptions(budget_s=budget_s))
    return m.verification.shipped


def frontier(results: dict, names: tuple[str, ...]) -> dict[str, bool]:
    """Per candidate among ``names``: no other of them is both faster and more accurate."""
    return {
        k: not any(
            results[o][0] < results[k][0] and results[o][1] > results[k][1] for o in names if o != k
        )
        for k in names
    }


def run_model(name, path, shapes, weights, args, tmp: Path, rows: list, ops: dict) -> None:
    graph = edgesplit.load_model(path, shapes)
    profile = edgesplit.profile_model(
        graph, edgesplit.load_device(DEVICE), edgesplit.ProfileOptions(runs=args.runs)
    )
    for op, (a, b) in speedups(graph, profile).items():
        ops[op][0] += a
        ops[op][1] += b
    plans, problems = candidates(graph, profile, args.calibration_method)
    bundles = {cand: tmp / f"{name}-{cand}" for cand in plans}
    for cand, plan in plans.items():
        edgesplit.compile_bundle(graph, plan, bundles[cand], device=DEVICE)
    what = {}
    for k in BUDGETS:
        out = bundles[f"shipped-{k}"] = tmp / f"{name}-shipped-{k}"
        what[f"shipped-{k}"] = shipped(
            problems[f"plan-{k}"], plans[f"plan-{k}"], out, args.verify_budget_s
        )
    ms = timed(graph, bundles, args.runs)
    results = {}
    for cand, bundle in bundles.items():
        acc = bundle_accuracy(bundle)
        plan = edgesplit.open_bundle(bundle).plan
        int8 = sum(len(p.nodes) for p in plan.parts if p.precision == "int8")
        label = f"{cand} ({what[cand]})" if cand in what else cand
        results[cand] = (
            ms[cand],
            acc.snr_db,
            acc.top1_agreement,
            int8,
            plan.predicted.latency_ms,
            label,
        )
    raw, ship = frontier(results, RAW), frontier(results, SHIPPED)
    for cand, (ms, snr, top1, int8, pred, label) in results.items():
        rows.append(
            (
                name,
                weights,
                label,
                int8,
                len(graph.nodes),
                pred,
                ms,
                snr,
                top1,
                raw.get(cand),
                ship.get(cand),
            )
        )


def print_rows(rows: list) -> None:
    def mark(front: bool | None) -> str:
        return "-" if front is None else "yes" if front else "no"

    for name, weights, cand, int8, n, pred, ms, snr, top1, raw, ship in rows:
        t1 = f"{top1:.0%}" if top1 is not None else "-"
        snr_s = "exact" if snr >= SNR_CAP_DB else f"{snr:.1f}"
        print(
            f"| {name} | {weights} | {cand} | {int8}/{n} | {pred:.1f} | {ms:.1f} | {snr_s} | {t1} "
            "| "
            f"{mark(raw)} | {mark(ship)} |",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--det-size", type=int, default=640)
    ap.add_argument(
        "--models", default="resnet18,mobilenetv2,ppocrv4-det", help="Comma-separated, in order."
    )
    ap.add_argument(
        "--calibration-method", default=DEFAULT_CALIBRATION_METHOD, choices=CALIBRATION_METHODS
    )
    ap.add_argument(
        "--verify-budget-s", type=float, default=20.0, help="deploy's measuring budget per plan."
    )
    args = ap.parse_args()
    load_start = os.getloadavg()
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    head = (
        "| model | weights | candidate | int8 nodes | predicted ms | measured ms | SNR dB | top-1 "
        "| frontier (raw) | frontier (shipped) |"
    )
    print(head + "\n|" + "---|" * 10, flush=True)
    with tempfile.TemporaryDirectory(prefix="edgesplit-precision-") as d:
        tmp = Path(d)
        found = {m[0]: m for m in models(tmp, args.det_size)}
        for name, path, shapes, weights in (found[n] for n in args.models.split(",") if n in found):
            rows: list = []
            run_model(name, path, shapes, weights, args, tmp, rows, ops)
            print_rows(rows)  # as each model finishes: a long run keeps what it measured
    print("\n| op type | fp32 on cpu ms | int8 on npu ms | speedup |\n|---|---|---|---|")
    for op, (a, b) in sorted(ops.items(), key=lambda kv: -kv[1][0]):
        print(
            f"| {op} | {a:.2f} | {b:.2f} | {a / b:.1f}x |"
            if b > 0
            else f"| {op} | {a:.2f} | {b:.2f} | fused away |"
        )
    print(
        f"\nbudgets: loose {BUDGETS['loose'].summary()}, tight {BUDGETS['tight'].summary()}; "
        f"calibration {args.calibration_method}; runs {args.runs}; verify budget "
        f"{args.verify_budget_s:g} s "
        f"per plan; numpy {np.__version__}"
    )
    print(  # timings taken while others run are noisy: say how busy the machine was
        "load average (1, 5, 15 min) at start "
        + ", ".join(f"{x:.1f}" for x in load_start)
        + ", at end "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg())
        + f" on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
