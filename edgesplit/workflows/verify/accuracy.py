"""The accuracy side of a verification: each candidate with int8 or fp16 parts, run as a bundle.

A candidate whose parts are all fp32 reproduces the model (compile checks its parts to 1e-3), so it
meets every budget and is not run. Every other candidate's bundle runs through the runtime
(:func:`edgesplit.runtime.accuracy.bundle_accuracy`, its int8/fp16 artifacts on their executors) on
the held-out samples of the calibration data the plan was measured on, and its outputs are compared
with the fp32 model's. The budget is the problem's (the one the plan was made under, or reloaded
from the plan by ``compile --verify``). :func:`edgesplit.workflows.verify.decide.decide` never ships
a
candidate that misses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from edgesplit.errors import EdgesplitError
from edgesplit.precision.metrics import DEFAULT_BUDGET, Accuracy, AccuracyBudget
from edgesplit.precision.record import AccuracyRecord
from edgesplit.workflows.resolve import Problem
from edgesplit.workflows.verify.candidates import Candidate


@dataclass(frozen=True)
class Measured:
    """One candidate's accuracy against fp32 and why it misses the budget (empty: it meets it)."""

    accuracy: Accuracy
    misses: tuple[str, ...]


def budget_of(problem: Problem) -> AccuracyBudget:
    return problem.accuracy.budget if problem.accuracy is not None else DEFAULT_BUDGET


def _calibration_data(problem: Problem, plan_record: AccuracyRecord | None) -> str | None:
    """The data the plan's accuracy was measured on: the problem's measurer's, else the plan's."""
    measurer = problem.accuracy.measure if problem.accuracy is not None else None
    given = getattr(measurer, "calibration_data", None)
    cal = plan_record.calibration if plan_record is not None else None
    return given or (cal.path if cal is not None else None)


def reduced(c: Candidate) -> bool:
    return c.plan is not None and any(p.precision != "fp32" for p in c.plan.parts)


def measure_accuracy(
    problem: Problem,
    cands: list[Candidate],
    executor_options: Callable[[str], Mapping | None] = lambda name: None,
) -> tuple[list[Candidate], dict[str, Measured]]:
    """The accuracy of every compiled candidate with reduced-precision parts (``executor_options``
    by candidate name: its server's URL); one that cannot be run for it gets the reason as its
    error (and is then not measured for latency either)."""
    from edgesplit.runtime.accuracy import bundle_accuracy

    budget = budget_of(problem)
    data = _calibration_data(problem, cands[0].plan.accuracy if cands[0].plan else None)
    out, found = [], {}
    for c in cands:
        if not (c.measurable and c.bundle is not None and reduced(c)):
            out.append(c)
            continue
        try:
            acc = bundle_accuracy(
                c.bundle,
                problem.graph,
                calibration_data=data,
                executor_options=executor_options(c.name),
            )
        except EdgesplitError as e:
            out.append(replace(c, error=f"its accuracy could not be measured: {e}"))
            continue
        found[c.name] = Measured(acc, tuple(budget.misses(acc)))
        out.append(c)
    return out, found
