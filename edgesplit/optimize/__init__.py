"""Partition a model over processors: cost model, objectives, exact and heuristic solvers, plans.

Pure: a function of a resolved :class:`Problem` (graph, costs, objective). Nothing here imports
onnxruntime, TVM or ``edgesplit.runtime``; the public ``partition`` (paths and names in) is
:func:`edgesplit.workflows.resolve.partition`, which resolves the problem and calls
:func:`solve_plan`.

Names are resolved on first use (as in ``edgesplit/__init__.py``): the runtime reads a bundle's
:class:`Plan` through ``edgesplit.optimize.plan`` and must not pull the solvers (scipy) in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # entry points
    "solve_plan": "edgesplit.optimize.planner",
    "solve": "edgesplit.optimize.solve",
    "Problem": "edgesplit.optimize.problem",
    # objectives
    "OBJECTIVES": "edgesplit.optimize.objectives",
    "Objective": "edgesplit.optimize.objectives",
    "objective": "edgesplit.optimize.objectives",
    # plans
    "Plan": "edgesplit.optimize.plan",
    "Part": "edgesplit.optimize.plan",
    "Transfer": "edgesplit.optimize.plan",
    "Baseline": "edgesplit.optimize.plan",
    "SolverInfo": "edgesplit.optimize.plan",
    "load_plan": "edgesplit.optimize.plan",
    # costs
    "CostModel": "edgesplit.optimize.costs",
    "Flow": "edgesplit.optimize.costs",
    "build_costs": "edgesplit.optimize.costs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edgesplit.optimize' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # for type checkers and IDEs; at run time the table above is used
    from edgesplit.optimize.costs import CostModel, Flow, build_costs  # noqa: F401
    from edgesplit.optimize.objectives import OBJECTIVES, Objective, objective  # noqa: F401
    from edgesplit.optimize.plan import Baseline, Part, Plan, SolverInfo, Transfer, load_plan  # noqa: F401
    from edgesplit.optimize.planner import solve_plan  # noqa: F401
    from edgesplit.optimize.problem import Problem  # noqa: F401
    from edgesplit.optimize.solve import solve  # noqa: F401
