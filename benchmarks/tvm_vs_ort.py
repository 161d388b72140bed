"""Per model: TVM untuned, TVM tuned with MetaSchedule (a trial budget; the database is cached
and reused), and ONNX Runtime, all on this CPU, and which backend the planner would pick.

Run: .venv/bin/python benchmarks/tvm_vs_ort.py [--trials 64] [--tune-models tiny_dag,squeezenet]
Tuning is slow on 2 cores (minutes per model), so only --tune-models are tuned.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgesplit.compile.tvm_build import build_library
from edgesplit.hostinfo import llvm_target
from edgesplit.model import zoo
from edgesplit.model.feeds import random_inputs
from edgesplit.model.load import load_model
from edgesplit.profile.tvm import time_vm


def tvm_ms(graph, lib: Path, runs: int) -> float:
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    feeds = random_inputs(graph)
    return float(np.median(time_vm(vm, tvm.cpu(), [feeds[n] for n in graph.inputs], runs)))


def ort_ms(path: Path, graph, runs: int) -> float:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = random_inputs(graph)
    for _ in range(5):
        sess.run(None, feeds)
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        t.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="tiny_dag,squeezenet,mobilenetv2,resnet18,transformer,chain_shrink")
    ap.add_argument("--tune-models", default="tiny_dag")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    target = llvm_target()
    tune = set(args.tune_models.split(",")) if args.tune_models else set()
    print(f"target {target}; MetaSchedule budget {args.trials} trials")
    print(f"{'model':<14}{'ORT ms':>9}{'TVM ms':>10}{'tuned ms':>10}{'tune s':>8}  faster backend")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = zoo.save(name, Path(tmp) / f"{name}.onnx")
            graph = load_model(path)
            o = ort_ms(path, graph, args.runs)
            try:
                build_library(graph.model, target, Path(tmp) / f"{name}.so", use_database=False)
                u = tvm_ms(graph, Path(tmp) / f"{name}.so", args.runs)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{name:<14}{o:>9.3f}  TVM failed: {str(e).strip().splitlines()[-1][:60]}")
                continue
            tuned, tune_s = "-", "-"
            best = min(("ort", o), ("tvm", u), key=lambda kv: kv[1])
            if name in tune:
                t0 = time.perf_counter()
                build_library(graph.model, target, Path(tmp) / f"{name}.tuned.so", tune_trials=args.trials)
                tune_s = f"{time.perf_counter() - t0:.0f}"
                tm = tvm_ms(graph, Path(tmp) / f"{name}.tuned.so", args.runs)
                tuned = f"{tm:.3f}"
                best = min(best, ("tvm tuned", tm), key=lambda kv: kv[1])
            print(f"{name:<14}{o:>9.3f}{u:>10.3f}{tuned:>10}{tune_s:>8}  {best[0]} ({best[1]:.3f} ms)")


if __name__ == "__main__":
    main()
