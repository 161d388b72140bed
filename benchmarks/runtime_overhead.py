"""Runtime overhead: a bundle of >= 4 parts, all on ORT CPU, against one ORT session on the whole
model, measured side by side in one run (alternating blocks of runs). Goal (issue 4): <= 1.05x.

Run: .venv/bin/python benchmarks/runtime_overhead.py [--parts 4] [--repeat 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgesplit.compile.manual import contiguous_plan
from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--models", default="resnet18,mobilenetv2,googlenet,transformer")
    ap.add_argument(
        "--device", default="host", help="host (2 threads) or host-2core (one core, 1 thread)"
    )
    ap.add_argument("--processor", default=None, help="default: the device's first processor")
    args = ap.parse_args()
    device = load_device(args.device)
    proc = device.processor(args.processor) if args.processor else device.processors[0]
    threads = proc.threads or 0
    print(
        f"device {device.name}, processor {proc.name}, {threads or 'default'} ORT threads on both "
        "sides"
    )
    print(
        f"{'model':<14}{'parts':>6}{'whole ORT ms':>14}{'bundle ms':>11}{'ratio':>8}  goal <= 1.05"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = zoo.save(name, Path(tmp) / f"{name}.onnx")
            graph = load_model(path)
            plan = contiguous_plan(graph, device.name, [(proc.name, "ort")] * args.parts)
            compile_bundle(graph, plan, Path(tmp) / name, device=device)
            so = ort.SessionOptions()
            so.log_severity_level = 3
            if threads:
                so.intra_op_num_threads = threads
            whole = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            with load(Path(tmp) / name) as sess:
                feeds = random_feeds(sess)
                for _ in range(10):
                    whole.run(None, feeds)
                    sess.run(feeds)
                # Alternating blocks, not single runs: an ORT session's threads spin for a while
                # after each run and would slow the other side's next run down.
                a, b = [], []
                block = max(5, args.repeat // 10)
                for _ in range(max(1, args.repeat // block)):
                    for side, fn in (
                        (a, partial(whole.run, None, feeds)),
                        (b, partial(sess.run, feeds)),
                    ):
                        for k in range(block + 2):
                            t0 = time.perf_counter()
                            fn()
                            if (
                                k >= 2
                            ):  # the first runs of a block still meet the other side's spinning
                                side.append(time.perf_counter() - t0)
            wa, wb = np.median(a) * 1e3, np.median(b) * 1e3
            print(
                f"{name:<14}{args.parts:>6}{wa:>14.3f}{wb:>11.3f}{wb / wa:>8.3f}  "
                f"{'yes' if wb / wa <= 1.05 else 'NO'}"
            )


if __name__ == "__main__":
    main()
