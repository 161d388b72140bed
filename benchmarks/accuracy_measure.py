"""The accuracy budget's measuring, timed three ways side by side on one plan's units.

When a plan misses its accuracy budget, the planner measures every reduced-precision unit of it
alone (the rest in fp32) and drops the least valuable (:mod:`edgesplit.optimize.accuracy`). This
times one such step on a zoo model's energy plan for the Snapdragon with an A100 over Wi-Fi, its
parts' sessions built beforehand (they are shared by content), in three ways, each way's whole
step in turn, twice (in one order, then the other):

- ``spinning``: each part's ORT session with a spinning thread pool, every part run (as before);
- ``no spin``: the sessions stop spinning after each run (``precision.measure`` now);
- ``no spin + reuse``: and a measurement takes the outputs of the parts that the last one on that
  sample began with (``PlanMeasurer._outputs``, now).

Every way must give the same figures (checked: the same accuracy to the last bit).

    .venv/bin/python benchmarks/accuracy_measure.py [--model transformer_large] [--units N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from edgesplit.device.cpu import ort_session_options
from edgesplit.device.spec import load_device, network_link
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.optimize.accuracy import _alone, reduced, units
from edgesplit.precision import measure
from edgesplit.precision.metrics import SNR_CAP_DB, AccuracyBudget, compare
from edgesplit.workflows.resolve import partition


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer_large")
    ap.add_argument("--units", type=int, default=0, help="the first N units of the plan (0: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        graph = load_model(zoo.save(args.model, Path(tmp) / f"{args.model}.onnx"))
        link = network_link("wifi", bandwidth_mbps=100)
        device, server = load_device("snapdragon-8gen2"), load_device("server-a100")
        loose = AccuracyBudget(min_snr_db=-SNR_CAP_DB)  # keeps every int8 part
        plan = partition(
            graph, device, server=server, link=link, objective="energy", accuracy=loose
        )
        cands = [u for p in reduced(plan) for u in units(graph, p)][: args.units or None]
        cases = [_alone(plan, u, graph) for u in cands]
        print(
            f"{args.model}: {len(graph.nodes)} nodes, plan of {len(plan.parts)} parts, "
            f"{len(cands)} units"
        )
        ways = {}
        for spin in (True, False):
            m = measure.PlanMeasurer(graph)
            if spin:
                m._memo = measure._Memo()  # its own sessions, spinning
            measure.ort_session_options = lambda t, c, spin_=spin, **kw: ort_session_options(
                t, c, spin=spin_
            )
            try:
                for parts in cases:  # build every session
                    m.run(parts, m.data.held_out[0])
            finally:
                measure.ort_session_options = ort_session_options
            ways["spinning" if spin else "no spin"] = (m, False)
        ways["no spin + reuse"] = (ways["no spin"][0], True)
        times: dict[str, list[float]] = {w: [] for w in ways}
        figures: dict[str, list] = {w: [] for w in ways}
        samples = range(len(ways["no spin"][0].data.held_out))
        for order in (list(ways), list(ways)[::-1]):  # each way's step whole, in turn, twice
            for way in order:
                m, reuse = ways[way]
                for parts in cases:
                    t = time.perf_counter()
                    if reuse:
                        outs = [m._outputs(parts, i) for i in samples]
                    else:
                        outs = [m.run(parts, m.data.held_out[i]) for i in samples]
                    times[way].append((time.perf_counter() - t) * 1e3)
                    figures[way].append(compare(m.reference, outs))
        first = times["spinning"]
        for way in ways:
            same = figures[way] == figures["spinning"]
            print(
                f"{way:16s} {statistics.median(times[way]):8.1f} ms a unit (median), "
                f"{sum(times[way]) / 1e3:6.1f} s "
                f"in all, {sum(first) / sum(times[way]):4.2f}x; figures the same: {same}"
            )


if __name__ == "__main__":
    main()
