"""A fleet group's candidate plans are held to the accuracy budget that ``partition`` holds plans
to: an int8 or fp16 candidate that misses it is never offered to the fleet."""

from __future__ import annotations

import dataclasses

import pytest

from edgesplit.fleet.candidates import group_candidates, plan_of
from edgesplit.model import zoo
from edgesplit.optimize.accuracy import AccuracyCheck, reduced
from edgesplit.optimize.planner import solve_plan
from edgesplit.precision.metrics import EXACT, Accuracy, AccuracyBudget
from edgesplit.workflows.resolve import Choices, resolve


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    """squeezenet on the Snapdragon 8 Gen 2 (an NPU that runs int8 and fp16 only), a server over
    Wi-Fi, costs predicted."""
    path = zoo.save("squeezenet", tmp_path_factory.mktemp("cands") / "squeezenet.onnx")
    return resolve(str(path), "snapdragon-8gen2", Choices(server="server-h200", link="wifi"))


def _with(problem, measure):
    check = AccuracyCheck(budget=AccuracyBudget(min_snr_db=30.0), measure=measure)
    return dataclasses.replace(problem, accuracy=check)


def _reduced_names(problem, made, cm):
    return {m.candidate.name for m in made if reduced(plan_of(problem, cm, m.assign))}


def test_reduced_precision_candidates_that_miss_the_budget_are_dropped(phone):
    measured = []

    def poor(parts):  # every reduced-precision plan loses accuracy
        measured.append(parts)
        return Accuracy(10.0, 0.9, 1.0) if any(p.precision != "fp32" for p in parts) else EXACT

    problem = _with(phone, poor)
    made, cm = group_candidates(problem, max_evals=50)
    assert made and measured  # reduced candidates existed and were measured
    assert _reduced_names(problem, made, cm) == set()
    # the group was planned again in fp32: the plan partition falls back on (fitted to the
    # budget) is on offer, or one at least as cheap in energy
    own = solve_plan(problem, max_evals=50)
    assert not [p for p in own.parts if p.precision != "fp32"]
    assert min(m.candidate.energy_mj for m in made) <= own.predicted.energy_mj * (1 + 1e-6)


def test_reduced_precision_candidates_within_the_budget_are_kept(phone):
    problem = _with(phone, lambda parts: EXACT)
    made, cm = group_candidates(problem, max_evals=50)
    assert _reduced_names(problem, made, cm)  # the NPU's int8 plans stay on offer
    unchecked, _ = group_candidates(dataclasses.replace(phone, accuracy=None), max_evals=50)
    assert {m.candidate.name for m in made} >= {m.candidate.name for m in unchecked}
