"""Runtime overhead: a bundle of >= 4 parts, all on ORT CPU, against one ORT session on the whole
model, measured side by side (interleaved) in one run. Goal (issue 4): <= 1.05x.

Run: .venv/bin/python benchmarks/runtime_overhead.py [--parts 4] [--repeat 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgesplit.compile.api import compile_bundle
from edgesplit.compile.manual import contiguous_plan
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.runtime.api import random_feeds
from edgesplit.runtime.session import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--models", default="resnet18,mobilenetv2,googlenet,transformer")
    args = ap.parse_args()
    print(f"{'model':<14}{'parts':>6}{'whole ORT ms':>14}{'bundle ms':>11}{'ratio':>8}  goal <= 1.05")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = zoo.save(name, Path(tmp) / f"{name}.onnx")
            graph = load_model(path)
            plan = contiguous_plan(graph, "host", [("cpu", "ort")] * args.parts)
            compile_bundle(graph, plan, Path(tmp) / name)
            so = ort.SessionOptions()
            so.log_severity_level = 3
            whole = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            with load(Path(tmp) / name) as sess:
                feeds = random_feeds(sess)
                for _ in range(10):
                    whole.run(None, feeds)
                    sess.run(feeds)
                a, b = [], []
                for _ in range(args.repeat):  # interleaved, so both see the same machine
                    t0 = time.perf_counter()
                    whole.run(None, feeds)
                    t1 = time.perf_counter()
                    sess.run(feeds)
                    t2 = time.perf_counter()
                    a.append(t1 - t0)
                    b.append(t2 - t1)
            wa, wb = np.median(a) * 1e3, np.median(b) * 1e3
            print(f"{name:<14}{args.parts:>6}{wa:>14.3f}{wb:>11.3f}{wb / wa:>8.3f}  {'yes' if wb / wa <= 1.05 else 'NO'}")


if __name__ == "__main__":
    main()
