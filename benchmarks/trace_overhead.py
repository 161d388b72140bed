"""What the runtime's always-on timing records cost per part run, and what a detailed trace costs.

1. The record-keeping a part run does (seven ``perf_counter_ns`` reads, one tuple appended to a
   deque, one run count), timed on its own in a tight loop: ns per part run.
2. A bundle of many small parts (a model cut into ``--parts`` contiguous ORT parts on one core):
   its median time per part run, so (1) can be read as a share of a real part.
3. The same bundle loaded with ``detailed=True`` (ORT's profiler and thread CPU time) against a
   plain load, in alternating blocks: the detailed trace's slowdown.

Run: .venv/bin/python benchmarks/trace_overhead.py [--model squeezenet] [--parts 20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

from edgesplit.compile.manual import contiguous_plan
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle


def record_cost_ns(n: int = 20000, rounds: int = 15) -> float:
    """The hot path's record-keeping per part run, as Session._run_part does it (best of rounds)."""
    clock = time.perf_counter_ns
    records: deque = deque(maxlen=100_000)
    counts = {"p0": 0}
    best = float("inf")
    for _ in range(rounds):
        t0 = clock()
        for i in range(n):
            ready, submit, start, rs, re, co = clock(), clock(), clock(), clock(), clock(), clock()
            k = counts["p0"]
            counts["p0"] = k + 1
            done = clock()
            records.append((i, "p0", k, ready, submit, start, rs, re, co, done, None))
        t1 = clock()
        for _ in range(n):
            pass
        best = min(best, ((t1 - t0) - (clock() - t1)) / n)
    return best


def per_part_ms(sess, feeds, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sess.run(feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3 / len(sess.manifest.parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--parts", type=int, default=20)
    ap.add_argument("--device", default="host-2core")
    ap.add_argument("--processor", default="core0")
    ap.add_argument("--repeat", type=int, default=100)
    args = ap.parse_args()
    cost = record_cost_ns()
    print(f"record-keeping per part run: {cost:.0f} ns (best of 15 rounds of 20000)")
    with tempfile.TemporaryDirectory() as tmp:
        graph = load_model(zoo.save(args.model, Path(tmp) / f"{args.model}.onnx"))
        plan = contiguous_plan(graph, args.device, [(args.processor, "ort")] * args.parts)
        compile_bundle(graph, plan, Path(tmp) / "b")
        with load(Path(tmp) / "b") as plain, load(Path(tmp) / "b", detailed=True) as detailed:
            feeds = random_feeds(plain)
            block = max(5, args.repeat // 10)
            a, b = [], []
            for _ in range(max(1, args.repeat // block)):
                for side, sess in ((a, plain), (b, detailed)):
                    sess.run(feeds)  # the first run of a block meets the other side's threads
                    side.append(per_part_ms(sess, feeds, block))
            pa, pb = float(np.median(a)), float(np.median(b))
            run_ms = float(np.median([p.run_ns for p in plain.trace_records().parts])) / 1e6
    print(
        f"{args.model} in {args.parts} parts on {args.device}/{args.processor}: {pa:.3f} ms per "
        "part run "
        f"(median run call {run_ms:.3f} ms); record-keeping is {cost / 1e6 / pa:.2%} of it"
    )
    print(
        f"detailed trace (ORT profiler + thread CPU time): {pb:.3f} ms per part run, {pb / pa:.2f}x"
    )


if __name__ == "__main__":
    main()
