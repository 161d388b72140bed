"""Solver time against the number of nodes, on random DAGs with costs made in code.

Two families, both on 4 processors (home CPU, two accelerators, one server GPU over a network):

* ``dnn-like``: chains broken by residual / inception-like blocks of parallel branches, costs from
  op classes (dense, elementwise, reshaping) with per-processor speed-ups as in a roofline model;
* ``layered``: random layered DAGs (each node reads 1-2 nodes of the previous layer, some skip
  edges), every node with its own random speed-ups: far more fan-out than real networks.

For each size the exact sequential-latency and energy solvers run (dominance, elimination, HiGHS
MILP on the core) with a time limit; the line says whether the plan is proven optimal or gives
HiGHS's MIP gap. Then the full ``latency`` objective (makespan: list scheduling and local search)
is timed once per size on the DNN-like family.

    .venv/bin/python benchmarks/solver_scaling.py [--sizes 100,1000,10000] [--time-limit 9]
"""

from __future__ import annotations

import argparse
import time

from edgesplit.optimize.exact import solve_sequential
from edgesplit.optimize.solve import solve
from edgesplit.optimize.synthetic import random_costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,300,1000,3000,10000")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=9.0, help="MILP time limit in s per solve")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="dnn-like,layered")
    ap.add_argument(
        "--makespan", action="store_true", help="also time the full latency (makespan) objective"
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"{'family':<9} {'nodes':>6} {'objective':<8} {'build+solve s':>13} {'result':<18} solver"
    )
    for family in args.families.split(","):
        for n in sizes:
            cm = random_costs(
                n,
                args.procs,
                args.seed,
                device_like=True,
                blocks=family == "dnn-like",
                unsupported=0.1,
            )
            for objective in ("latency", "energy"):
                t0 = time.perf_counter()
                sol = solve_sequential(cm, objective, time_limit_s=args.time_limit)
                dt = time.perf_counter() - t0
                result = "optimal" if sol.optimal and sol.gap == 0 else f"gap {sol.gap:.3%}"
                print(
                    f"{family:<9} {n:>6} {objective:<8} {dt:>13.3f} {result:<18} {sol.solver}",
                    flush=True,
                )
            if args.makespan and family == "dnn-like":
                t0 = time.perf_counter()
                out = solve(cm, "latency", time_limit_s=args.time_limit, max_evals=100)
                dt = time.perf_counter() - t0
                print(
                    f"{family:<9} {n:>6} {'makespan':<8} {dt:>13.3f} "
                    f"{'gap %.1f%%' % (100 * out.solver.gap):<18} "
                    f"{out.solver.name}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
