"""Pipelined stream throughput of a balanced 2-stage plan on the 2-core device (host-2core: one
stage per core, cut where the measured per-node latency reaches half) against one stage alone
(the whole model on one core), side by side in one run. Also printed: the optimiser's own
throughput plan (measured and predicted) and ORT on the whole model with 2 intra-op threads.
Goal (issue 4): >= 1.7x. Also printed: ORT on the whole model with 2 intra-op threads.

Run: .venv/bin/python benchmarks/pipeline_throughput.py [--requests 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import onnxruntime as ort

from edgesplit.compile.manual import contiguous_plan
from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.resolve import partition


def throughput(sess, feeds, n: int) -> float:
    t0 = time.perf_counter()
    for _ in sess.run_stream(feeds for _ in range(n)):
        pass
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--models", default="resnet18,googlenet,mobilenetv2")
    args = ap.parse_args()
    device = load_device("host-2core")
    print(
        f"{'model':<14}{'1 core /s':>11}{'2-stage /s':>12}{'speedup':>9}  >=1.7x"
        f"{'opt /s':>9}{'predicted':>11}{'parts':>7}{'ORT 2 threads /s':>18}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = zoo.save(name, Path(tmp) / f"{name}.onnx")
            graph = load_model(path)
            prof = profile_model(graph, device, ProfileOptions(runs=10, warmup=3))
            e = prof.entry("core0", "ort")
            # The 2-stage plan: cut where the measured per-node latency on core0 reaches half.
            acc, cut = 0.0, 1
            for i, n in enumerate(graph.nodes):
                acc += e.nodes[n.name].latency_ms
                if acc >= e.sum_ms / 2:
                    cut = i + 1
                    break
            flops = [max(n.flops, 1) for n in graph.nodes]
            two = contiguous_plan(
                graph,
                "host-2core",
                [("core0", "ort"), ("core1", "ort")],
                weights=[sum(flops[:cut]), sum(flops[cut:])],
            )
            one = contiguous_plan(graph, "host-2core", [("core0", "ort")])
            # The optimiser's throughput objective, free to use more stages.
            plan = partition(graph, device, objective="throughput", profile=prof)
            compile_bundle(graph, one, Path(tmp) / f"{name}-1")
            compile_bundle(graph, two, Path(tmp) / f"{name}-2")
            compile_bundle(graph, plan, Path(tmp) / f"{name}-opt", device=device)
            so = ort.SessionOptions()
            so.intra_op_num_threads = 2
            so.log_severity_level = 3
            whole = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            rates = []
            for suffix in ("1", "2", "opt"):
                with load(Path(tmp) / f"{name}-{suffix}") as sess:
                    feeds = random_feeds(sess)
                    throughput(sess, feeds, 10)
                    rates.append(throughput(sess, feeds, args.requests))
            a, b, o = rates
            t0 = time.perf_counter()
            for _ in range(args.requests):
                whole.run(None, feeds)
            c = args.requests / (time.perf_counter() - t0)
            pred = plan.predicted.throughput_per_s
            print(
                f"{name:<14}{a:>11.1f}{b:>12.1f}{b / a:>9.2f}  {'yes' if b / a >= 1.7 else 'NO':<5}"
                f"{o:>9.1f}{pred:>11.1f}{len(plan.parts):>7}{c:>18.1f}"
            )


if __name__ == "__main__":
    main()
