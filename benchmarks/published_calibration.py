"""How well the roofline predictor matches published latencies of hardware we do not have, before
and after calibrating each spec's per-processor efficiencies (issue 10, item 6).

For every device with figures in profiles/published/, per (processor, precision): the plain
roofline's error on each figure, and the error of a fit on every *other* zoo model's figures
(leave one model out: a model measured with several runtimes is left out whole). Prints per
group and overall: median and max absolute percentage error, share within +-10% and +-25%.
Figures of models the zoo cannot build are listed as cited only.
Run: .venv/bin/python benchmarks/published_calibration.py [--figures] [--write]
  --write  refit on all figures and write profiles/fitted/DEVICE.json
"""

from __future__ import annotations

import argparse

import numpy as np

from edgesplit.device.spec import load_device
from edgesplit.profile.fit import (
    calibration_document,
    fit_group,
    groups,
    leave_one_out,
    write_calibration,
)
from edgesplit.profile.published import fit_path, load_published, published_devices


def stats(errors: list[float]) -> str:
    """'median / max / within 10 / within 25' of absolute percentage errors."""
    if not errors:
        return f"{'-':>6} {'-':>7} {'-':>6} {'-':>6}"
    a = np.abs(errors)
    return f"{np.median(a):5.0f}% {a.max():6.0f}% {np.mean(a <= 10):6.0%} {np.mean(a <= 25):6.0%}"


def pct(pred: float, actual: float) -> float:
    return (pred - actual) / actual * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--figures", action="store_true", help="print every figure, not only the groups"
    )
    ap.add_argument("--write", action="store_true", help="write the fitted calibration files")
    args = ap.parse_args()

    head = f"{'device':18s} {'processor':10s} {'prec':5s} {'n':>3s} {'models':>6s}"
    cols = f"{'med':>6} {'max':>7} {'<=10%':>6} {'<=25%':>6}"
    print(
        f"{head} | before: {cols} | after (LOO): {cols} | fitted e_c / e_m / overhead_ms / call_ms"
    )
    all_before: list[float] = []
    all_after: list[float] = []
    for device in published_devices():
        spec, published = load_device(device), load_published(device)
        entries = []
        for group in groups(spec, published):
            preds = leave_one_out(group)
            fitted = fit_group(group)
            entries.append(fitted)
            before = [pct(p.plain_ms, p.figure.latency_ms) for p in preds]
            after = [pct(p.loo_ms, p.figure.latency_ms) for p in preds if p.loo_ms is not None]
            all_before += before
            all_after += after
            print(
                f"{device:18s} {group.processor.name:10s} {group.precision:5s} {len(preds):3d} "
                f"{len(group.models):6d} | before: {stats(before)} | after (LOO): {stats(after)} | "
                f"{fitted.compute_efficiency:.3f} / {fitted.memory_efficiency:.3f} / "
                f"{fitted.overhead_ms:.4f} / {fitted.call_ms:.3f}"
            )
            if args.figures:
                for p in preds:
                    loo = f"{p.loo_ms:8.3f}" if p.loo_ms is not None else "       -"
                    print(
                        f"    {p.figure.id:40s} published {p.figure.latency_ms:8.3f} ms  "
                        f"plain {p.plain_ms:8.3f}  LOO {loo}"
                    )
        cited_only = [f.id for f in published.figures if f.zoo_model is None]
        if cited_only:
            print(f"{device:18s} cited only (no zoo model): {len(cited_only)} figures")
        if args.write and entries:
            path = fit_path(device)
            write_calibration(path, calibration_document(spec, published, entries))
            print(f"{device:18s} wrote {path}")
    print(
        f"{'all':18s} {'':10s} {'':5s} {len(all_before):3d} {'':6s} | before: {stats(all_before)} "
        "| "
        f"after (LOO): {stats(all_after)} ({len(all_after)} figures with a LOO prediction)"
    )


if __name__ == "__main__":
    main()
