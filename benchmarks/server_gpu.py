"""A server GPU's parts, compiled here and run there: TVM CUDA parts against ONNX Runtime's CPU.

The offload server's parts are compiled on the machine that runs ``compile``, which has no GPU,
with TVM's CUDA target, and run where the GPU is. This script does the two halves:

    # here: bundles for an NVIDIA GPU (compute capability --arch), with the reference outputs
    .venv/bin/python benchmarks/server_gpu.py build OUT [--arch sm_90]
    # on the GPU machine: load each bundle with the edgesplit runtime, check, time
    python benchmarks/server_gpu.py run OUT [--runs 50] [--json result.json]

``build`` needs no CUDA toolkit: where no CUDA driver is, TVM keeps the kernels as CUDA C++ and
the TVM that loads the part compiles them with NVRTC (so ``run`` needs a full TVM, the
``cuda-bindings`` package and CUDA's headers: ``$CUDA_HOME``, or found from ``nvcc``). Per model it
writes two bundles, the whole model as one TVM CUDA part, and two parts (the first half on the
server's CPU in ONNX Runtime, the rest on the GPU in TVM, so a tensor crosses from host to device
inside the runtime), plus the inputs and the whole model's ONNX Runtime outputs computed here
(``ref.npz``). ``run`` checks the outputs against that reference (within 1e-4 of the largest
magnitude, as the bundle tests) and times, per bundle, the median of ``--runs`` requests after a
warm-up, beside ONNX Runtime's CPU provider on the whole model in the same process (all cores).

Measured 2026-12-04 on an H200 (16 cores of its host for ORT), untuned TVM (dlight's default
schedules), median of 200 requests, outputs within 8e-7 of ORT's:

    model        ORT CPU ms  GPU 1 part ms  CPU+GPU 2 parts ms   built
    tiny_dag           0.11           0.22                0.33   here (no GPU)
    squeezenet         1.31           0.75                1.52   here (no GPU)
    mobilenetv2        1.63           2.84                2.29   on the H200
    resnet18           3.55           3.59                5.00   on the H200
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgesplit.backends.ort.profile import time_runs

MODELS = ("tiny_dag", "squeezenet", "mobilenetv2", "resnet18")
SPEC = """\
name: server-gpu
kind: device
local: true
description: an offload server's NVIDIA GPU and its host CPU (benchmarks/server_gpu.py)
processors:
  cpu:
    kind: cpu
    peak_gflops: 1000
    mem_bandwidth_gbps: 50
    active_w: 60
    idle_w: 20
    backends: [{{runtime: ort, provider: CPUExecutionProvider}}]
  gpu:
    kind: gpu
    peak_gflops: 60000
    mem_bandwidth_gbps: 4800
    active_w: 700
    idle_w: 70
    backends: [{{runtime: tvm, target: {{kind: cuda, arch: {arch}}}}}]
default_link: {{bandwidth_gbps: 25, latency_ms: 0.01}}
"""


def build(out: Path, arch: str, models: list[str]) -> None:
    import onnxruntime as ort

    from edgesplit.compile.manual import contiguous_plan
    from edgesplit.model import zoo
    from edgesplit.model.feeds import random_inputs
    from edgesplit.model.load import load_model
    from edgesplit.workflows.compile import compile_bundle

    out.mkdir(parents=True, exist_ok=True)
    spec = out / "server-gpu.yaml"
    spec.write_text(SPEC.format(arch=arch))
    for name in models:
        path = zoo.save(name, out / f"{name}.onnx")
        graph = load_model(path)
        for tag, sites in (
            ("gpu", [("gpu", "tvm")]),
            ("cpu+gpu", [("cpu", "ort"), ("gpu", "tvm")]),
        ):
            t0 = time.perf_counter()
            plan = contiguous_plan(graph, str(spec), sites)
            compile_bundle(graph, plan, out / f"{name}.{tag}", device=str(spec), force=True)
            print(f"{name} {tag}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = random_inputs(graph)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        np.savez(
            out / f"{name}.ref.npz",
            **{f"in:{k}": v for k, v in feeds.items()},
            **{f"out:{k}": v for k, v in want.items()},
        )


def _median_ms(fn, runs: int) -> float:
    return statistics.median(time_runs(fn, runs, warmup=5))


def run(out: Path, runs: int, models: list[str]) -> list[dict]:
    import onnxruntime as ort

    from edgesplit.runtime.session import load

    rows = []
    for name in models:
        ref = np.load(out / f"{name}.ref.npz")
        feeds = {k[3:]: ref[k] for k in ref.files if k.startswith("in:")}
        want = {k[4:]: ref[k] for k in ref.files if k.startswith("out:")}
        # the whole model: its own file, else the one-part bundle's part (the same graph)
        model = out / f"{name}.onnx"
        model = model if model.exists() else out / f"{name}.gpu" / "parts" / "p0.onnx"
        cpu = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        row: dict = {
            "model": name,
            "ort_cpu_ms": _median_ms(functools.partial(cpu.run, None, feeds), runs),
        }
        for tag in ("gpu", "cpu+gpu"):
            if not (out / f"{name}.{tag}").exists():
                continue  # not built, or not carried to this machine
            try:
                with load(out / f"{name}.{tag}") as sess:
                    got = sess.run(feeds)
                    err = max(
                        float(np.max(np.abs(got[k] - want[k])))
                        / (float(np.max(np.abs(want[k]))) + 1e-12)
                        for k in want
                    )
                    row[tag] = {
                        "parts": len(sess.manifest.parts),
                        "max_rel_err": err,
                        "ok": bool(err <= 1e-4 + 1e-6),
                        "ms": _median_ms(functools.partial(sess.run, feeds), runs),
                    }
            except Exception as e:  # noqa: BLE001  (a report, not a library: name what broke)
                row[tag] = {"error": f"{type(e).__name__}: {e}"[:400]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out", type=Path)
    b.add_argument("--arch", default="sm_90")
    b.add_argument("--models", default=",".join(MODELS))
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--runs", type=int, default=50)
    r.add_argument("--models", default=",".join(MODELS))
    r.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    models = a.models.split(",")
    if a.cmd == "build":
        build(a.out, a.arch, models)
        return 0
    rows = run(a.out, a.runs, models)
    print(
        f"\n{'model':<12} {'ORT CPU ms':>10} {'GPU 1 part ms':>14} {'CPU+GPU 2 parts ms':>19}  "
        "outputs"
    )
    for row in rows:
        cells = [row[t].get("ms") if t in row else None for t in ("gpu", "cpu+gpu")]
        ok = all(row[t].get("ok") for t in ("gpu", "cpu+gpu") if t in row)
        print(
            f"{row['model']:<12} {row['ort_cpu_ms']:>10.2f} "
            + " ".join(f"{c:>14.2f}" if c is not None else f"{'-':>14}" for c in cells)
            + f"  {'equal' if ok else 'NOT EQUAL / failed'}"
        )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(row[t].get("ok") for row in rows for t in ("gpu", "cpu+gpu") if t in row) else 1


if __name__ == "__main__":
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    sys.exit(main())
