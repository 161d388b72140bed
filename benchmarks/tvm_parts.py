"""Where does tuned TVM beat ONNX Runtime, kernel by kernel, and does the planner then choose it?

Per zoo model, on ``host-biglittle``'s big core (one thread; the shipped tuning databases are for
that target): profile ORT and TVM (TVM's entries measured per fused kernel with the tuned
schedules, :mod:`edgesplit.backends.tvm.profile`), then print each TVM kernel (a node and its fused
elementwise chain) beside ORT's time for the same nodes, which is faster and why, and the plan the
planner makes with every node on the big core: the backend of each part, and how many nodes run
on TVM. With ``--run``, the plan is compiled and timed against whole-model ORT (part boundaries
cost real time: DESIGN.md measured ~0.26 ms each).

    .venv/bin/python benchmarks/tvm_parts.py [--models squeezenet,mobilenetv2,resnet18] [--runs 10]
        [--work DIR (keeps the profiles; reruns reuse them)] [--run]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM loads: the big core's one thread
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

import numpy as np  # noqa: E402

from edgesplit.backends.tvm.profile import fusion_groups  # noqa: E402
from edgesplit.device.spec import load_device  # noqa: E402
from edgesplit.model import zoo  # noqa: E402
from edgesplit.model.load import load_model  # noqa: E402
from edgesplit.profile.store import load_profile  # noqa: E402

DEVICE, PROC = "host-biglittle", "big"
SMALL_MFLOP = 2.0  # below this, a kernel's fixed per-call cost is a large share of its time


def why(ops: list[str], mflop: float, tvm_wins: bool) -> str:
    if not tvm_wins:
        return "ORT's kernel is faster"
    if mflop < SMALL_MFLOP:
        return "small kernel: ORT's per-node dispatch weighs more"
    if len(ops) >= 3:
        return "fused elementwise chain (one pass over memory)"
    return "tuned schedule faster"


def kernel_table(graph, prof) -> list[tuple[str, str, float, float, float]]:
    """Per TVM kernel: (first node, ops, MFLOP, ORT ms, TVM ms) from the two profile entries."""
    ort, tvm = prof.entry(PROC, "ort"), prof.entry(PROC, "tvm")
    rows = []
    for group in fusion_groups(graph, [n for n in graph.nodes if n.name in tvm.nodes]):
        names = [n.name for n in group]
        rows.append(
            (
                names[0],
                "+".join(n.op_type for n in group),
                sum(n.flops for n in group) / 1e6,
                sum(ort.nodes[n].latency_ms for n in names if n in ort.nodes),
                sum(tvm.nodes[n].latency_ms for n in names),
            )
        )
    return rows


def profile(graph, work: Path, runs: int):
    from edgesplit.profile.run import ProfileOptions, profile_model

    path = work / f"{graph.name}.{DEVICE}.{PROC}.profile.json"
    if path.exists():
        return load_profile(path)
    t0 = time.perf_counter()
    prof = profile_model(
        graph, load_device(DEVICE), ProfileOptions(processors=[PROC], runs=runs, warmup=3)
    )
    prof.save(path)
    print(f"  profiled in {time.perf_counter() - t0:.0f} s -> {path}")
    return prof


def report(graph, prof) -> None:
    rows = kernel_table(graph, prof)
    ort, tvm = prof.entry(PROC, "ort"), prof.entry(PROC, "tvm")
    wins = [r for r in rows if r[4] < r[3]]
    print(f"  TVM: {tvm.note}")
    print(
        f"  whole model: ORT {ort.whole_model_ms:.3f} ms, TVM "
        f"{tvm.whole_model_ms or float('nan'):.3f} ms; "
        f"kernels: {len(rows)}, TVM faster on {len(wins)}"
    )
    print(
        f"  {'first node':<28}{'ops':<24}{'MFLOP':>8}{'ORT ms':>9}{'TVM ms':>9}{'TVM/ORT':>8}  why"
    )
    for first, ops, mflop, o, t in sorted(rows, key=lambda r: r[4] / max(r[3], 1e-9)):
        print(
            f"  {first[:27]:<28}{ops[:23]:<24}{mflop:>8.2f}{o:>9.4f}{t:>9.4f}"
            f"{t / max(o, 1e-9):>7.2f}x "
            " "
            f"{why(ops.split('+'), mflop, t < o)}"
        )


def plan_and_run(graph, prof, work: Path, run: bool, runs: int) -> None:
    from edgesplit.workflows.resolve import partition

    pins = {n.name: PROC for n in graph.nodes}
    plan = partition(graph, load_device(DEVICE), objective="latency", profile=prof, pins=pins)
    on_tvm = sum(len(p.nodes) for p in plan.parts if p.backend == "tvm")
    backends = [p.backend for p in plan.parts]
    print(
        f"  plan: {len(plan.parts)} parts "
        f"({', '.join(f'{b} x{backends.count(b)}' for b in sorted(set(backends)))}), "
        f"{on_tvm}/{len(graph.nodes)} nodes on TVM, predicted {plan.predicted.latency_ms:.3f} ms"
    )
    for p in plan.parts:
        if p.backend == "tvm":
            ops = "+".join(graph.nodes[graph.index[n]].op_type for n in p.nodes)
            print(f"    {p.name}: tvm {ops[:60]} ({p.latency_ms:.3f} ms predicted)")
    if not run or on_tvm == 0:
        return
    import edgesplit
    from edgesplit.model.feeds import random_inputs
    from edgesplit.workflows.compile import compile_bundle

    bundle = work / f"{graph.name}.bundle"
    compile_bundle(graph, plan, bundle)
    feeds = random_inputs(graph)
    from edgesplit.runtime.harness import single_requests_ms

    with edgesplit.load(bundle) as sess:
        single_requests_ms(sess, feeds, 3)  # warm-up
        t = single_requests_ms(sess, feeds, runs)
    print(
        f"  measured: the plan's bundle {np.median(t):.3f} ms (whole-model ORT in the profile: see "
        "above)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="squeezenet,mobilenetv2,resnet18")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--run", action="store_true", help="Compile the plan and time it.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            print(f"== {name}")
            graph = load_model(zoo.save(name, work / f"{name}.onnx"))
            prof = profile(graph, work, args.runs)
            report(graph, prof)
            plan_and_run(graph, prof, work, args.run, args.runs)


if __name__ == "__main__":
    main()
