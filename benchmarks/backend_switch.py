"""Two runtimes on one core: does a TVM module's thread pool slow the ORT part that runs next?

DESIGN.md measured squeezenet in ORT at 13.5 ms when its runs alternated with a TVM module's and
4.6 ms in a block of its own (TVM's pool threads spin after a call). The runtime now sets
``TVM_THREAD_POOL_SPIN_COUNT=0`` for TVM parts that share a processor (``runtime/executors.py``);
this script runs an ORT session alone, and alternating with a TVM module, on one core, in a fresh
process per setting (TVM reads the variable once), with TVM's pool at the processor's thread count
and at the host's default.

Run: .venv/bin/python benchmarks/backend_switch.py [--model squeezenet] [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
import numpy as np
os.sched_setaffinity(0, {0})
from edgesplit.model.load import load_model
from edgesplit.device.cpu import ort_session_options
from edgesplit.backends.tvm.profile import build_vm
import onnxruntime as ort, tvm
g = load_model(sys.argv[1]); runs = int(sys.argv[2])
x = np.random.default_rng(0).standard_normal(g.tensors[g.inputs[0]].shape).astype(np.float32)
so = ort_session_options(1, (0,), spin=False)
sess = ort.InferenceSession(g.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
vm, dev = build_vm(g.model, {"kind": "llvm", "mcpu": "native"})
arg = tvm.runtime.tensor(x, dev)
def ort_ms():
    t0 = time.perf_counter(); sess.run(None, {g.inputs[0]: x})
    return (time.perf_counter() - t0) * 1e3
for _ in range(5): ort_ms(); vm["main"](arg)
alone = [ort_ms() for _ in range(runs)]
mixed = []
for _ in range(runs):
    vm["main"](arg)
    mixed.append(ort_ms())
print(json.dumps({"alone": float(np.median(alone)), "alternating": float(np.median(mixed))}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    from edgesplit.model import zoo

    with tempfile.TemporaryDirectory() as tmp:
        path = zoo.save(args.model, Path(tmp) / f"{args.model}.onnx")
        print(f"{'TVM threads':<14}{'spin count':<12}{'ORT alone ms':>14}{'ORT after TVM ms':>18}")
        for threads in ("1", ""):
            for spin in ("", "0"):
                env = dict(os.environ)
                env.pop("TVM_THREAD_POOL_SPIN_COUNT", None)
                env.pop("TVM_NUM_THREADS", None)
                if spin:
                    env["TVM_THREAD_POOL_SPIN_COUNT"] = spin
                if threads:
                    env["TVM_NUM_THREADS"] = threads
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(path), str(args.runs)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"{threads or 'default':<14}{spin or 'default':<12}{r['alone']:>14.2f}"
                    f"{r['alternating']:>18.2f}"
                )


if __name__ == "__main__":
    main()
