"""Tuned TVM against ONNX Runtime, side by side, one thread on one core, with the shipped databases.

Per model: ORT's latency, TVM's with the tuning databases for this CPU's target (``profiles/tvm/``
and the cache: :mod:`edgesplit.backends.tvm.database`), their ratio, how many of the model's kernels
the
databases cover, and what tuning them cost (trials and wall time, from the database's
``target.json``). Nothing is tuned here: run ``edgesplit tune`` first (the README says how the
shipped databases were made). ``--untuned`` adds TVM without any database (slow: seconds per run).

Both runtimes run in this process, pinned to one core with one thread each, in alternating blocks
(``--rounds`` of ``--runs`` each; TVM's thread pool told not to spin after a call:
``TVM_THREAD_POOL_SPIN_COUNT=0``), so neither steals the core from the other and both see the
same background load; the figures are medians over all runs. Outputs are checked against ORT's.

    .venv/bin/python benchmarks/tvm_vs_ort.py [--models squeezenet,mobilenetv2,resnet18]
        [--runs 10] [--rounds 5] [--untuned]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

CORE = 0
# Before TVM loads: one worker thread, no spinning after a call (TVM_NUM_THREADS and
# TVM_THREAD_POOL_SPIN_COUNT are read by libtvm_runtime when its pool starts).
os.environ.setdefault("TVM_NUM_THREADS", "1")
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

import numpy as np  # noqa: E402

from edgesplit.backends.tvm.database import find_databases, read_target_file  # noqa: E402
from edgesplit.device.host import llvm_target  # noqa: E402
from edgesplit.model import zoo  # noqa: E402
from edgesplit.model.feeds import random_inputs  # noqa: E402
from edgesplit.model.load import load_model  # noqa: E402


def ort_runner(graph, feeds):
    """(a call that runs the model once, its outputs) on ORT, one thread on CORE."""
    import onnxruntime as ort

    from edgesplit.device.cpu import ort_session_options

    so = ort_session_options(1, (CORE,))
    sess = ort.InferenceSession(
        graph.model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return (lambda: sess.run(None, feeds)), sess.run(None, feeds)


def tvm_runner(graph, feeds, lib: Path):
    """(a call that runs the model once, its outputs) on the TVM library ``lib`` (the runtime's
    :class:`~edgesplit.backends.tvm.build.TvmLibrary`)."""
    from edgesplit.backends.tvm.build import TvmLibrary

    vm = TvmLibrary(lib, llvm_target())
    args = vm.tensors([feeds[n] for n in graph.inputs])
    return (lambda: vm.call(args)), vm.outputs(vm.call(args))


def side_by_side(fns, runs: int, rounds: int) -> list[float]:
    """Median ms of each call in ``fns``, timed in alternating blocks of ``runs`` (after a
    warm-up)."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        for _ in range(3):
            fn()
    for _ in range(rounds):
        for fn, t in zip(fns, times):
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                t.append((time.perf_counter() - t0) * 1e3)
    return [float(np.median(t)) for t in times]


def coverage(graph, tuning, paths) -> tuple[int, int]:
    """(kernels of the model that a database holds, kernels of the model)."""
    import tvm
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.s_tir import meta_schedule as ms

    from edgesplit.backends.tvm.database import lower_for_tuning, open_database

    with contextlib.redirect_stdout(io.StringIO()):
        mod = lower_for_tuning(from_onnx(graph.model, keep_params_in_input=False), tuning)
        tasks = ms.relax_integration.extract_tasks(mod, tvm.target.Target(dict(tuning)))
    if not paths:
        return 0, len(tasks)
    db = open_database(paths)
    return sum(1 for t in tasks if db.has_workload(t.dispatched[0])), len(tasks)


def tuning_cost(paths, model: str) -> tuple[int, float, str]:
    """(trials, wall s, how) spent tuning ``model``'s kernels, from the databases' records of
    runs."""
    trials, wall, how = 0, 0.0, set()
    for p in paths:
        for run in (read_target_file(p) or {}).get("runs", []):
            if run.get("model") == model:
                trials += int(run["trials"])
                wall += float(run["elapsed_s"])
                how.add(f"{run['trials_per_task']}/kernel max, {run['builder_cores']} build cores")
    return trials, wall, "; ".join(sorted(how))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="squeezenet,mobilenetv2,resnet18")
    ap.add_argument("--runs", type=int, default=10, help="Runs per block.")
    ap.add_argument("--rounds", type=int, default=5, help="Alternating blocks per runtime.")
    ap.add_argument("--untuned", action="store_true", help="Also time TVM without any database.")
    args = ap.parse_args()
    os.sched_setaffinity(0, {CORE})
    target = llvm_target()
    lookup = find_databases(target, 1)
    print(f"target {json.dumps(lookup.tuning)}, one thread on core {CORE}")
    print(
        "databases: "
        + (", ".join(str(p) for p in lookup.paths) or "none (run edgesplit tune first)")
    )
    for note in lookup.notes:
        print(f"  not used: {note}")
    head = (
        f"{'model':<13}{'ORT ms':>9}{'TVM ms':>9}{'TVM/ORT':>9}{'kernels':>9}{'trials':>8}"
        f"{'tune s':>8}"
    )
    print(head + ("  untuned ms" if args.untuned else "") + "  max rel err")
    from edgesplit.backends.tvm.build import build_library
    from edgesplit.model.values import rel_error

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            graph = load_model(zoo.save(name, Path(tmp) / f"{name}.onnx"))
            feeds = random_inputs(graph)
            build_library(graph.model, target, Path(tmp) / f"{name}.so", threads=1)
            run_tvm, got = tvm_runner(graph, feeds, Path(tmp) / f"{name}.so")
            run_ort, want = ort_runner(graph, feeds)
            t_tvm, t_ort = side_by_side([run_tvm, run_ort], args.runs, args.rounds)
            err = max(rel_error(g, w) for g, w in zip(got, want))
            have, total = coverage(graph, lookup.tuning, lookup.paths)
            trials, wall, _ = tuning_cost(lookup.paths, name)
            row = (
                f"{name:<13}{t_ort:>9.3f}{t_tvm:>9.3f}{t_tvm / t_ort:>8.2f}x{have:>5}/{total:<3}"
                f"{trials:>8}{wall:>8.0f}"
            )
            if args.untuned:
                build_library(graph.model, target, Path(tmp) / f"{name}.u.so", databases=None)
                untuned = tvm_runner(graph, feeds, Path(tmp) / f"{name}.u.so")[0]
                row += f"{side_by_side([untuned], 3, 1)[0]:>12.1f}"
            print(f"{row}  {err:.1e}", flush=True)
    for p in lookup.paths:
        for run in (read_target_file(p) or {}).get("runs", []):
            print(
                f"  tuned {run['model']}: {run['trials']} trials ({run['trials_per_task']}/kernel "
                "max) "
                f"in {run['elapsed_s']:.0f} s on {run['builder_cores']} cores, {run['date']}"
            )


if __name__ == "__main__":
    sys.exit(main())
