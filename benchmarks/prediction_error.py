"""Predicted against measured end-to-end latency for every zoo model under several plans on this
machine (host-biglittle: core 0 big, core 1 throttled to 40%). Goal (issue 4): >= 90% of the
(model, plan) pairs within +-10%.

Plans per model, each predicted by the optimiser's cost model from a measured profile:
the latency plan, everything pinned to big, everything pinned to little, the energy plan.
Run: .venv/bin/python benchmarks/prediction_error.py [--repeat 30]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.runtime.harness import random_feeds, single_requests_ms
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.resolve import partition


def measure(bundle: Path, repeat: int) -> float:
    with load(bundle) as sess:
        feeds = random_feeds(sess)
        single_requests_ms(sess, feeds, 3)  # warm-up
        t = single_requests_ms(sess, feeds, repeat)
    return float(np.median(t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--device", default="host-biglittle")
    args = ap.parse_args()
    device = load_device(args.device)
    procs = [p.name for p in device.processors]
    print(
        f"{'model':<18}{'plan':<14}{'parts':>6}{'predicted ms':>14}{'measured ms':>13}{'error':>9}"
    )
    within = within5 = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = zoo.save(name, Path(tmp) / f"{name}.onnx")
            graph = load_model(path)
            prof = profile_model(graph, device, ProfileOptions(["ort"], runs=20, warmup=5))
            plans = {"latency": dict(objective="latency")}
            for p in procs:
                plans[f"only:{p}"] = dict(
                    objective="latency", pins={n.name: p for n in graph.nodes}
                )
            plans["energy"] = dict(objective="energy")
            for label, kw in plans.items():
                plan = partition(graph, device, profile=prof, **kw)
                out = Path(tmp) / f"{name}-{label.replace(':', '_')}"
                compile_bundle(graph, plan, out, device=device)
                pred = plan.predicted.latency_ms
                got = measure(out, args.repeat)
                err = got / pred - 1
                ok = abs(err) <= 0.10
                within += ok
                within5 += abs(err) <= 0.05
                total += 1
                print(
                    f"{name:<18}{label:<14}{len(plan.parts):>6}{pred:>14.3f}{got:>13.3f}{err:>+9.1%}"
                    f"{'' if ok else '  *'}"
                )
    print(
        f"\n{within}/{total} = {within / total:.0%} of predictions within +-10% of the measured "
        "median"
    )
    print(f"{within5}/{total} = {within5 / total:.0%} within +-5%")


if __name__ == "__main__":
    main()
