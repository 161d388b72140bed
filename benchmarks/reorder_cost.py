"""What a part boundary costs inside ORT: layout reorders and the fixed cost of a run call.

Each model is cut into 1, 4 and 8 contiguous parts, all on one core (``host-2core``/core0), and
run with a detailed trace (ORT's profiler): per request, the reorder kernels ORT inserts for its
NCHWc layout (``ReorderInput``/``ReorderOutput``) and their time, the tensors crossing part
boundaries, and each run call's cost outside its kernels. The 1-part bundle is the baseline: the
reorders a whole model needs anyway.

Run: .venv/bin/python benchmarks/reorder_cost.py [--models resnet18,googlenet,squeezenet] [--repeat
20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from edgesplit.compile.manual import contiguous_plan
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle


def measure(bundle: Path, repeat: int) -> dict[str, float]:
    with load(bundle, detailed=True) as sess:
        feeds = random_feeds(sess)
        for _ in range(3):
            sess.run(feeds)
        sess.reset_stats()
        lat = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            sess.run(feeds)
            lat.append((time.perf_counter() - t0) * 1e3)
        trace = sess.end_detailed_trace()
        crossing = sum(
            1
            for p in sess.manifest.parts
            for t in p.inputs
            if t.name not in {i.name for i in sess.manifest.inputs}
        )
    per_req: dict[int, dict[str, float]] = {}
    for e in trace.engine_runs:
        d = per_req.setdefault(e.request, {"reorders": 0, "reorder_ms": 0.0, "kernels_ms": 0.0})
        d["reorders"] += e.reorders
        d["reorder_ms"] += e.reorder_ns / 1e6
        d["kernels_ms"] += e.kernels_ns / 1e6
    run_ms = {}
    for p in trace.parts:
        run_ms[p.request] = run_ms.get(p.request, 0.0) + p.run_ns / 1e6
    n_parts = len({p.part for p in trace.parts})
    return {
        "latency_ms": float(np.median(lat)),
        "reorders": float(np.median([d["reorders"] for d in per_req.values()])),
        "reorder_ms": float(np.median([d["reorder_ms"] for d in per_req.values()])),
        "fixed_ms": float(
            np.median([(run_ms[r] - d["kernels_ms"]) / n_parts for r, d in per_req.items()])
        ),
        "crossing": crossing,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="resnet18,googlenet,squeezenet")
    ap.add_argument("--parts", default="1,4,8")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    print(
        f"{'model':<12}{'parts':>6}{'crossing':>9}{'latency ms':>12}{'reorders':>9}"
        f"{'reorder ms':>11}"
        f"{'extra per crossing ms':>23}{'run call - kernels, per part ms':>33}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            graph = load_model(zoo.save(name, Path(tmp) / f"{name}.onnx"))
            base = None
            for n in (int(x) for x in args.parts.split(",")):
                plan = contiguous_plan(graph, "host-2core", [("core0", "ort")] * n)
                out = Path(tmp) / f"{name}-{n}"
                compile_bundle(graph, plan, out)
                m = measure(out, args.repeat)
                base = base or m
                extra = (
                    (m["reorder_ms"] - base["reorder_ms"]) / m["crossing"]
                    if m["crossing"]
                    else float("nan")
                )
                print(
                    f"{name:<12}{n:>6}{m['crossing']:>9}{m['latency_ms']:>12.2f}{m['reorders']:>9.0f}"
                    f"{m['reorder_ms']:>11.3f}{extra:>23.3f}{m['fixed_ms']:>33.3f}"
                )


if __name__ == "__main__":
    main()
