"""Does the optimiser tell the truth? Predicted against measured, and the plan against every
baseline, for whole plans on this machine (issue 10 item 7).

Cases: each model (every zoo model and PP-OCRv4 det by default) on each device (``host-biglittle``,
``host-2core``; with ``--offload`` also the offload lab at 5, 50 and 200 Mbit/s) under each plan
(the optimiser's latency, energy and throughput plans) and every baseline ``deploy`` verifies
against (each single processor with each backend worth trying, and with a server the best single
cut and server-only). Candidates are built and measured by :mod:`edgesplit.workflows.verify`'s own
code
(:func:`~edgesplit.workflows.verify.candidates.candidates`,
:func:`~edgesplit.workflows.verify.measure.measure`): real
bundles, measured in rotating order for ``--rounds`` rounds so that drift of the machine cancels.

Latency and energy plans, and the baselines, are measured on single requests (energy is not
measured here: an energy plan's predicted *latency* is checked); the throughput plan and the
baselines again on a stream (the predicted period against the measured one). Per case: predicted,
measured median and spread across rounds, error, and measured / the best measured baseline.

``--profile-dir`` holds the profiles (``MODEL.DEVICE.profile.json``): measured and saved there when
missing, read when present, so a second run with a calibrated profile in place of the plain one
reports the figures after calibration (``--calibrate`` does so itself where ``edgesplit
calibrate`` exists).

The offload lab (``--offload``; root, network namespaces, ``tc`` and a cgroup v1 CPU quota) is
``benchmarks/offload_sweep.py``'s: the device is this CPU on one thread in a 25 % quota, the server
``edgesplit serve`` in a network namespace behind a shaped veth pair with 10 ms of RTT. There the
candidates are measured by a worker process inside the quota (the same :func:`measure`).

Run: .venv/bin/python benchmarks/plan_truth.py [--models squeezenet,resnet18]
     [--devices host-biglittle,host-2core] [--rounds 3] [--offload] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

import edgesplit
from edgesplit.model import zoo
from edgesplit.model.load import load_model, parse_input_shapes
from edgesplit.optimize.planner import solve_plan
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.workflows.resolve import Choices, resolve
from edgesplit.workflows.verify.candidates import (
    Candidate,
    candidates,
    compile_candidates,
    signature,
)
from edgesplit.workflows.verify.measure import measure

sys.path.insert(0, str(Path(__file__).resolve().parent))
import truth_lab  # noqa: E402 (the offload lab and the worker that measures inside its quota)

warnings.filterwarnings("ignore", message="Renaming name")  # TVM's ONNX frontend, once per node
PLANS = ("latency", "energy", "throughput")
GROUPS = {
    "latency": ("latency", "energy"),
    "throughput": ("throughput",),
}  # metric -> plans measured on it
PPOCR = "ppocr-det"
PPOCR_SHAPE = "x=1,3,640,640"


@dataclass(frozen=True)
class Row:
    """One case: a plan or a baseline on one device, measured on one metric."""

    device: str
    model: str
    metric: str  # latency (single requests) or throughput (stream period)
    name: str  # latency / energy / throughput (the optimiser's plans) or a baseline's name
    kind: str  # plan or baseline
    parts: int
    predicted_ms: float | None
    measured_ms: float | None
    spread_pct: float | None
    rounds_ms: tuple[float, ...]
    error_pct: float | None
    best_baseline: str | None
    ratio_to_best_baseline: float | None
    same_as: str | None = None
    note: str | None = None
    profile: str = "plain"
    bundle: str | None = None


def model_file(name: str, work: Path) -> tuple[Path, dict | None]:
    """The ONNX file of a zoo model (saved once in ``work``) or of PP-OCRv4 det (in its wheel)."""
    if name == PPOCR:
        import importlib.util

        spec = importlib.util.find_spec("rapidocr_onnxruntime")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("ppocr-det needs rapidocr-onnxruntime (scripts/setup.sh installs it)")
        models = Path(next(iter(spec.submodule_search_locations))) / "models"
        return sorted(models.glob("*det*.onnx"))[0], parse_input_shapes([PPOCR_SHAPE])
    path = work / f"{name}.onnx"
    if not path.is_file():
        zoo.save(name, path)
    return path, None


def profile_for(graph, device: str, profile_dir: Path, model: str, args) -> Path:
    """The profile in ``profile_dir``: read when present, else (for the plain pass) measured here
    with
    every backend (or ``--backends``) and saved."""
    label, backends = args.label, tuple(args.backends.split(",")) if args.backends else None
    path = (
        profile_dir / f"{model}.{device}{'.' + '+'.join(backends) if backends else ''}.profile.json"
    )
    if not path.is_file() and label != "plain":
        raise edgesplit.EdgesplitError(f"no {label} profile {path}")
    if not path.is_file():
        t0 = time.perf_counter()
        profile_model(graph, edgesplit.load_device(device), ProfileOptions(backends)).save(path)
        print(f"  profiled {model} on {device} in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def group(graph, device, metric: str, choices: dict) -> tuple[object, list[tuple[str, Candidate]]]:
    """The plans measured on ``metric`` and the baselines for it, as verify builds them; identical
    bundles are marked ``same_as`` the first of them (built and measured once)."""
    made, problem = [], None
    for objective in GROUPS[metric]:
        prob = resolve(graph, device, Choices(objective=objective, **choices))
        plan = solve_plan(prob)
        cands = candidates(prob, plan, metric)
        made.append(("plan", replace(cands[0], name=objective, same_as=None)))
        if problem is None:
            problem, base = prob, [replace(c, same_as=None) for c in cands[1:]]
    made += [("baseline", c) for c in base]
    seen, out = {}, []
    for kind, c in made:
        if c.plan is not None and c.error is None:
            sig = signature(c.plan)
            c = replace(c, same_as=seen[sig]) if sig in seen else c
            seen.setdefault(sig, c.name)
        out.append((kind, c))
    return problem, out


def rows_of(device, model, metric, entries, meas: dict, profile: str) -> list[Row]:
    """Per candidate: its figures, error, and its median over the best measured baseline's."""
    med = {n: float(np.median(r)) for n, r in meas["rounds_ms"].items() if r}
    base = {c.name: med.get(c.same_as or c.name) for kind, c in entries if kind == "baseline"}
    base = {n: v for n, v in base.items() if v is not None}
    best = min(base, key=base.get) if base else None
    out = []
    for kind, c in entries:
        twin = c.same_as or c.name
        rounds = tuple(round(x, 4) for x in meas["rounds_ms"].get(twin, ()))
        m = med.get(twin)
        fig = c.plan.predicted if c.plan is not None else None
        pred = None if fig is None else fig.period_ms if metric == "throughput" else fig.latency_ms
        note = c.error or meas["errors"].get(twin) or (meas["short"] if m is None else None)
        out.append(
            Row(
                device, model, metric, c.name, kind, len(c.plan.parts) if c.plan else 0, pred, m,
                (max(rounds) - min(rounds)) / m * 100 if m else None, rounds,
                (m / pred - 1) * 100 if m and pred else None, best,
                m / base[best] if m and best else None, c.same_as, note, profile,
                str(c.bundle) if c.bundle else None,
            )
        )  # fmt: skip
    return out


def run_group(
    graph, device, model: str, metric: str, choices: dict, args, measurer, label=None
) -> list[Row]:
    """Build one group's candidates (``device``: a name or a spec, printed as ``label``), measure
    them."""
    label = label or str(device)
    problem, entries = group(graph, device, metric, choices)
    stage = Path(args.work) / "bundles" / args.label / label / model / metric
    stage.mkdir(parents=True, exist_ok=True)
    built = compile_candidates(problem, [c for _, c in entries], stage)
    entries = [(k, c) for (k, _), c in zip(entries, built)]
    bundles = {c.name: c.bundle for _, c in entries if c.bundle is not None}
    meas = measurer(bundles, metric, {c.name: c for _, c in entries})
    rows = rows_of(label, model, metric, entries, meas, args.label)
    for r in rows:
        print_row(r)
    return rows


def local_measurer(args):
    def run(bundles, metric, cands) -> dict:
        m = measure(bundles, metric, args.budget_s, min_rounds=args.rounds, max_rounds=args.rounds)
        return {"rounds_ms": dict(m.rounds_ms), "errors": dict(m.errors), "short": m.short}

    return run


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_header() -> None:
    print(
        f"{'device':<16}{'model':<14}{'metric':<11}{'case':<22}{'parts':>6}{'predicted':>11}{'measured':>10}"
        f"{'spread%':>9}{'error%':>9}{'/best base':>11}  note"
    )


def print_row(r: Row) -> None:
    note = f"= {r.same_as}" if r.same_as else (r.note or "")[:60]
    print(
        f"{r.device:<16}{r.model:<14}{r.metric:<11}"
        f"{('*' if r.kind == 'plan' else ' ') + r.name:<22}"
        f"{r.parts:>6}{fmt(r.predicted_ms, '.3f'):>11}{fmt(r.measured_ms, '.3f'):>10}"
        f"{fmt(r.spread_pct, '.1f'):>9}"
        f"{fmt(r.error_pct, '+.1f'):>9}{fmt(r.ratio_to_best_baseline, '.3f'):>11}  {note}",
        flush=True,
    )


def shipped(plan: Row, rows: list[Row]) -> tuple[str, float] | None:
    """What ``deploy`` ships instead of ``plan`` on these measurements (its rule,
    :mod:`edgesplit.workflows.verify.decide`: the plan only when faster than the best measured
    baseline in
    every round, paired by round) and its median over that baseline's; None if unmeasured."""
    base = [
        r
        for r in rows
        if (r.device, r.model, r.metric, r.kind)
        == (plan.device, plan.model, plan.metric, "baseline")
        and r.measured_ms is not None
    ]
    if plan.measured_ms is None or not base:
        return None
    best = min(base, key=lambda r: r.measured_ms)
    n = min(len(plan.rounds_ms), len(best.rounds_ms))
    q = np.asarray(plan.rounds_ms[:n]) / np.asarray(best.rounds_ms[:n])
    if plan.same_as == best.name or (n and float(q.max()) < 1.0):
        return plan.name, plan.measured_ms / best.measured_ms
    return best.name, 1.0


def relative_errors(rows: list[Row]) -> list[float]:
    """Per plan, its measured ratio to the best measured baseline over the predicted ratio of the
    same two, minus 1: the cost model's error on what a plan gains, with the machine's drift since
    profiling (which moves both alike) cancelled. Plans that are that baseline are left out."""
    out = []
    for r in rows:
        if r.kind != "plan" or r.ratio_to_best_baseline is None or not r.predicted_ms:
            continue
        best = next(
            (
                b
                for b in rows
                if (b.device, b.model, b.metric, b.kind, b.name)
                == (r.device, r.model, r.metric, "baseline", r.best_baseline)
            ),
            None,
        )
        if best is None or not best.predicted_ms or best.same_as == r.name:
            continue
        out.append(r.ratio_to_best_baseline / (r.predicted_ms / best.predicted_ms) - 1)
    return out


def by_device(rows: list[Row]) -> dict[str, dict[str, int]]:
    """Per device, the cases and how many are within +-10 % and +-5 % (an emulated processor's
    drift,
    ``host-biglittle``'s little core, shows as one device's share)."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        if r.error_pct is not None:
            d = out.setdefault(r.device, {"cases": 0, "within_10pct": 0, "within_5pct": 0})
            d["cases"] += 1
            d["within_10pct"] += abs(r.error_pct) <= 10
            d["within_5pct"] += abs(r.error_pct) <= 5
    return out


def pipeline_bias(rows: list[Row]) -> dict[str, dict[str, float | int | None]]:
    """Per device, the median error of the pipelines (throughput plans of two or more parts) beside
    that of the single processors' stream baselines in the same pass: a pipeline's period is its
    slowest stage, so it is where the processors drifting apart, and stream-only effects, show."""
    out: dict[str, dict[str, float | int | None]] = {}
    for dev in sorted({r.device for r in rows}):
        mine = [
            r
            for r in rows
            if r.device == dev and r.metric == "throughput" and r.error_pct is not None
        ]
        pipes = [r.error_pct for r in mine if r.kind == "plan" and r.parts > 1 and not r.same_as]
        single = [
            r.error_pct for r in mine if r.kind == "baseline" and r.parts == 1 and not r.same_as
        ]
        out[dev] = {
            "pipelines": len(pipes),
            "pipeline_median_error_pct": round(float(np.median(pipes)), 2) if pipes else None,
            "singles": len(single),
            "single_median_error_pct": round(float(np.median(single)), 2) if single else None,
        }
    return out


def summary(rows: list[Row]) -> dict:
    """Share within +-10 % and +-5 % (in all, and per device), the worst plan against its best
    baseline, plans that beat it."""
    errs = [abs(r.error_pct) for r in rows if r.error_pct is not None]
    plans = [r for r in rows if r.kind == "plan" and r.ratio_to_best_baseline is not None]
    worst = max(plans, key=lambda r: r.ratio_to_best_baseline, default=None)
    beats = [r for r in plans if r.ratio_to_best_baseline <= 0.95]
    ships = [(r, shipped(r, rows)) for r in plans]
    ships = [(r, x) for r, x in ships if x is not None]
    s = {
        "cases": len(errs),
        "within_10pct": sum(e <= 10 for e in errs),
        "within_5pct": sum(e <= 5 for e in errs),
        "plan_cases": len(plans),
        "worst_plan_ratio": worst.ratio_to_best_baseline if worst else None,
        "worst_plan": f"{worst.device} {worst.model} {worst.name} ({worst.metric})"
        if worst
        else None,
        "plans_beating_best_baseline_by_5pct": [f"{r.device} {r.model} {r.name}" for r in beats],
        "unmeasured": [
            f"{r.device} {r.model} {r.name}: {r.note}" for r in rows if r.measured_ms is None
        ],
        "relative_errors_pct": [round(e * 100, 2) for e in relative_errors(rows)],
        "deploy_ships_the_plan": sum(x[0] == r.name for r, x in ships),
        "deploy_worst_shipped_ratio": max((x[1] for _, x in ships), default=None),
        "deploy_shipped_beating_best_baseline_by_5pct": sum(x[1] <= 0.95 for _, x in ships),
        "by_device": by_device(rows),
        "pipeline_bias": pipeline_bias(rows),
    }
    n = max(1, s["cases"])
    print(
        f"\n[{rows[0].profile if rows else '-'}] {s['cases']} cases: within +-10% "
        f"{s['within_10pct']} "
        f"({s['within_10pct'] / n:.0%}), within +-5% {s['within_5pct']} "
        f"({s['within_5pct'] / n:.0%}); "
        f"worst plan / best measured baseline {fmt(s['worst_plan_ratio'], '.3f')} "
        f"({s['worst_plan']}); "
        f"plans >= 5% faster than the best baseline: {len(beats)}/{len(plans)}"
    )
    print(
        "  deploy's rule on these rounds: ships the plan in "
        f"{s['deploy_ships_the_plan']}/{len(ships)} cases, "
        f"else the best baseline; shipped / best measured baseline at worst "
        f"{fmt(s['deploy_worst_shipped_ratio'], '.3f')}; shipped >= 5% faster than it: "
        f"{s['deploy_shipped_beating_best_baseline_by_5pct']}/{len(ships)}"
    )
    print(
        "  by device: "
        + "; ".join(
            f"{dev} {d['within_10pct']}/{d['cases']} within +-10%, {d['within_5pct']} within +-5%"
            for dev, d in s["by_device"].items()
        )
    )
    rel = [abs(e) for e in s["relative_errors_pct"]]
    if rel:
        print(
            "  plans against their best baseline (measured ratio / predicted ratio - 1, drift "
            "cancelled): "
            f"{len(rel)} plans, within +-10% {sum(e <= 10 for e in rel)}, within +-5% "
            f"{sum(e <= 5 for e in rel)}, "
            f"worst {max(rel):.1f}%"
        )
    print(
        "  pipelines (2+ parts, stream) against single processors (stream), median error: "
        + "; ".join(
            f"{dev} {fmt(b['pipeline_median_error_pct'], '+.1f')}% ({b['pipelines']}) against "
            f"{fmt(b['single_median_error_pct'], '+.1f')}% ({b['singles']})"
            for dev, b in s["pipeline_bias"].items()
        )
    )
    for u in s["unmeasured"]:
        print(f"  not measured: {u}")
    return s


def run_local(names: list[str], devices: list[str], args) -> list[Row]:
    rows, work = [], Path(args.work)
    measurer = local_measurer(args)
    for model in names:
        path, shapes = model_file(model, work)
        graph = load_model(path, input_shapes=shapes)
        for device in devices:
            for metric in ("latency", "throughput"):
                try:
                    prof = profile_for(graph, device, Path(args.profile_dir), model, args)
                    rows += run_group(
                        graph, device, model, metric, {"profile": prof}, args, measurer
                    )
                except edgesplit.EdgesplitError as e:
                    print(f"{device:<16}{model:<14}{metric:<11}failed: {e}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models", default=",".join([*zoo.names(), PPOCR]), help="zoo names and ppocr-det"
    )
    ap.add_argument("--devices", default="host-biglittle,host-2core")
    ap.add_argument(
        "--backends", help="profile only these backends (default: every one the device has)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (at least 3)")
    ap.add_argument(
        "--budget-s", type=float, default=120.0, help="measuring time per group of candidates"
    )
    ap.add_argument("--offload", action="store_true", help="also the offload lab (root, netns, tc)")
    ap.add_argument("--bandwidths", default="5,50,200", help="the offload lab's Mbit/s")
    ap.add_argument(
        "--work", default="out/plan_truth", help="models, bundles (and default profiles)"
    )
    ap.add_argument(
        "--profile-dir", help="profiles MODEL.DEVICE.profile.json (default WORK/profiles)"
    )
    ap.add_argument("--label", default="plain", help="what the profiles are (plain, calibrated...)")
    ap.add_argument(
        "--calibrate", action="store_true", help="then calibrate on the plan bundles, rerun"
    )
    ap.add_argument("--calibrate-rounds", type=int, default=1, help="edgesplit refit --rounds")
    ap.add_argument("--json", help="write every case and the summary here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return truth_lab.worker()
    if args.rounds < 3:
        ap.error("--rounds: at least 3")
    args.profile_dir = args.profile_dir or str(Path(args.work) / "profiles")
    Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    args.plain_profile_dir = args.profile_dir
    names, devices = args.models.split(","), [d for d in args.devices.split(",") if d]
    results = {"args": vars(args), "passes": []}
    for label, profile_dir in passes(args):
        args.label, args.profile_dir = label, profile_dir
        print_header()
        t0 = time.time()
        rows = run_local(names, devices, args)
        if args.offload:
            rows += truth_lab.run_offload(names, args, run_group, model_file)
        results["passes"].append(
            {
                "profile": label, "started": t0, "ended": time.time(), "summary": summary(rows),
                "rows": [asdict(r) for r in rows],
            }
        )  # fmt: skip
        if args.calibrate and label == "plain" and not truth_lab.calibrate(args, rows):
            break
    if len(results["passes"]) > 1:
        results["repeatability"] = repeatability(results["passes"][0], results["passes"][-1])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


def repeatability(first: dict, last: dict) -> dict:
    """The machine against itself: the baselines (the same whole-model bundles: plans change with a
    calibrated profile, baselines do not) measured in both passes, the second median over the first.

    A prediction is made before it is measured, so drift since then is part of its error. The first
    pass's measurement is such a prediction for the second pass. An oracle that knew each bundle's
    mean speed would do better by about sqrt(2) if the two passes' errors were independent (the
    difference of two has sqrt(2) times the spread of one): so the share within +-10 % (+-5 %) of
    the
    changes shrunk by sqrt(2) is about the best any cost model can reach here, in a run like this.
    """
    key = lambda r: (r["device"], r["model"], r["metric"], r["name"])  # noqa: E731
    before = {
        key(r): r["measured_ms"]
        for r in first["rows"]
        if r["kind"] == "baseline" and r["measured_ms"]
    }
    after = {
        key(r): r["measured_ms"]
        for r in last["rows"]
        if r["kind"] == "baseline" and r["measured_ms"]
    }
    change = sorted((after[k] / before[k] - 1) * 100 for k in before.keys() & after.keys())
    gap_min = (last["started"] - first["started"]) / 60
    s = {
        "cases": len(change),
        "within_10pct": sum(abs(c) <= 10 for c in change),
        "within_5pct": sum(abs(c) <= 5 for c in change),
        "oracle_within_10pct": sum(abs(c) <= 10 * 2**0.5 for c in change),
        "oracle_within_5pct": sum(abs(c) <= 5 * 2**0.5 for c in change),
        "change_pct": [round(c, 1) for c in change],
        "passes_apart_min": round(gap_min, 1),
    }
    n = max(1, s["cases"])
    print(
        f"\n[the machine against itself] {s['cases']} baselines measured in both passes (which "
        "began "
        f"{gap_min:.0f} min apart): within +-10% {s['within_10pct']} "
        f"({s['within_10pct'] / n:.0%}), "
        f"within +-5% {s['within_5pct']} ({s['within_5pct'] / n:.0%}); second / first - 1 from "
        f"{change[0] if change else 0:+.1f}% to {change[-1] if change else 0:+.1f}%; an oracle of "
        "each "
        f"bundle's mean speed (changes / sqrt 2): within +-10% {s['oracle_within_10pct'] / n:.0%}, "
        f"within +-5% {s['oracle_within_5pct'] / n:.0%}"
    )
    return s


def passes(args):
    """The plain pass, then (with ``--calibrate``) one with the calibrated profiles."""
    yield args.label, args.profile_dir
    if args.calibrate:
        yield "calibrated", str(Path(args.work) / "profiles-calibrated")


if __name__ == "__main__":
    main()
