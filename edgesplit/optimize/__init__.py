"""Partition a model over processors: cost model, exact and heuristic solvers, plans.

Pure: a function of (graph, costs, objective). Nothing here imports onnxruntime, TVM or
``edgesplit.runtime``.
"""

from __future__ import annotations

from edgesplit.optimize.api import complete_profile, partition
from edgesplit.optimize.costs import CostModel, Flow, build_costs
from edgesplit.optimize.plan import Baseline, Part, Plan, SolverInfo, Transfer, load_plan
from edgesplit.optimize.solve import OBJECTIVES, solve

__all__ = [
    # entry points
    "partition",
    "solve",
    "OBJECTIVES",
    # plans
    "Plan",
    "Part",
    "Transfer",
    "Baseline",
    "SolverInfo",
    "load_plan",
    # costs
    "CostModel",
    "Flow",
    "build_costs",
    "complete_profile",
]
