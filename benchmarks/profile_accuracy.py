"""For every zoo model (and PP-OCR det when installed): ORT sum of per-node medians against the
measured whole-model median, and the time to profile.

Goal (issue 2): the sum of per-node medians within +-15% of the whole-model median.
Run: .venv/bin/python benchmarks/profile_accuracy.py [--runs 20] [--tvm]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions, profile_model


def models(tmp: Path) -> list[tuple[str, Path, dict]]:
    out = [(name, zoo.save(name, tmp / f"{name}.onnx"), {}) for name in zoo.names()]
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations))) / "models"
        for kind, shape in (
            ("det", (1, 3, 640, 640)),
            ("rec", (1, 3, 48, 320)),
            ("cls", (1, 3, 48, 192)),
        ):
            found = sorted(root.glob(f"*{kind}*.onnx"))
            if found:
                out.append((f"ppocr-{kind}", found[0], {"x": shape}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument(
        "--tvm", action="store_true", help="also profile TVM (slow: untuned, node by node)"
    )
    args = ap.parse_args()
    host = load_device("host")
    backends = ["ort", "tvm"] if args.tvm else ["ort"]
    print(
        f"{'model':<20}{'nodes':>7}{'GFLOPs':>9}{'whole ms':>10}{'sum ms':>10}{'sum/whole':>11}"
        f"{'load s':>8}{'profile s':>11}  within 15%"
    )
    ok = 0
    rows = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, shapes in models(Path(tmp)):
            t0 = time.perf_counter()
            graph = load_model(path, shapes or None)
            t1 = time.perf_counter()
            prof = profile_model(graph, host, ProfileOptions(backends, runs=args.runs, warmup=5))
            t2 = time.perf_counter()
            e = prof.entry("cpu", "ort")
            ratio = e.sum_ms / e.whole_model_ms
            good = abs(ratio - 1) <= 0.15
            ok += good
            rows += 1
            print(
                f"{name:<20}{len(graph.nodes):>7}{graph.total_flops / 1e9:>9.3f}"
                f"{e.whole_model_ms:>10.3f}"
                f"{e.sum_ms:>10.3f}{ratio:>11.3f}{t1 - t0:>8.2f}{t2 - t1:>11.2f}  "
                f"{'yes' if good else 'NO'}"
            )
            if args.tvm and (tv := prof.entry("cpu", "tvm")) is not None:
                whole = f"{tv.whole_model_ms:.3f}" if tv.whole_model_ms else "-"
                print(
                    f"{'  tvm':<20}{len(tv.nodes):>7}{'':>9}{whole:>10}{tv.sum_ms:>10.3f}  "
                    f"{tv.note[:60]}"
                )
    print(
        f"\n{ok}/{rows} models have the ORT sum of per-node medians within +-15% of the "
        "whole-model median"
    )


if __name__ == "__main__":
    main()
