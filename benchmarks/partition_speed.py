"""How long ``partition`` takes on zoo models, and how fast the local search scores assignments.

The plans of ``tests/test_optimize_models.py``: each model on the Snapdragon 8 Gen 2 spec with the
A100 server over Wi-Fi at 1 to 1,000 Mbit/s (predicted profiles, so only the optimiser runs). For
each model the line gives the CPU seconds of all its plans, the schedules the local search scored
(each a part-level list schedule of one assignment) and the CPU microseconds per schedule (all of
the plans' CPU time over their schedules: the search's share dominates).

    .venv/bin/python benchmarks/partition_speed.py [--models googlenet,transformer] [--repeats 3]

Run it at two commits to compare (the figures of one run are the best of ``--repeats``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from edgesplit.device.spec import load_device, network_link
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.optimize import schedule as schedule_module
from edgesplit.workflows.resolve import partition

BANDWIDTHS = (1, 3, 10, 30, 100, 300, 1000)


def _count_layouts() -> list[int]:
    """Count the assignments the optimiser lays out and schedules, whichever entry point it uses."""
    counter = [0]
    real = schedule_module.layout

    def counted(*a, **k):
        counter[0] += 1
        return real(*a, **k)

    schedule_module.layout = counted
    return counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,googlenet,transformer")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device, server = load_device("snapdragon-8gen2"), load_device("server-a100")
    counter = _count_layouts()
    folder = Path(tempfile.mkdtemp())
    print(
        f"{'model':<12} {'nodes':>5} {'plans':>5} {'cpu s':>7} {'schedules':>9} {'us/schedule':>11}"
    )
    for name in args.models.split(","):
        graph = load_model(zoo.save(name, folder / f"{name}.onnx"))
        runs = []
        for _ in range(args.repeats):
            counter[0] = 0
            t0 = time.process_time()
            for bw in BANDWIDTHS:
                partition(
                    graph, device, server=server, link=network_link("wifi", bandwidth_mbps=bw)
                )
            runs.append((time.process_time() - t0, counter[0]))
        cpu_s, n = min(runs)
        print(
            f"{name:<12} {len(graph.nodes):>5} {len(BANDWIDTHS):>5} {cpu_s:>7.2f} {n:>9} "
            f"{1e6 * cpu_s / max(n, 1):>11.0f}",
            flush=True,
        )
    print(f"(best of {args.repeats}; CPU seconds of this process; numpy {np.__version__})")


if __name__ == "__main__":
    main()
