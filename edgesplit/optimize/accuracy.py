"""The accuracy budget of a plan: reduced-precision parts only where the whole plan meets it.

Pure: the measuring is handed in (:class:`AccuracyCheck`, built by :mod:`edgesplit.pipeline` on
:class:`edgesplit.precision.measure.PlanMeasurer`); nothing here runs a model.

:func:`fit_budget` starts from the plan the objective chose and measures it whole. While it
misses the budget, it measures each reduced-precision (int8, fp16) part alone (the others in fp32)
and drops the least valuable one: the one that saves the fewest predicted ms per unit of noise it
adds (noise power over signal power, plus changed top-1 classes). Dropping it means re-solving
with reduced precision allowed only on the nodes of the plan's other reduced parts, so the next
plan's reduced nodes are a strict subset of this one's. The sequence of plans does not depend on
the budget, and a budget stops it at the first plan that meets it: a tighter budget stops later,
so it never has more reduced-precision nodes. An all-fp32 plan meets every budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from edgesplit.device import DeviceSpec
from edgesplit.errors import PlanError
from edgesplit.optimize.plan import Part, Plan
from edgesplit.precision.metrics import DEFAULT_BUDGET, EXACT, Accuracy, AccuracyBudget
from edgesplit.profile.store import Profile

if TYPE_CHECKING:
    from edgesplit.optimize.problem import Problem

Measure = Callable[[Sequence[Part]], Accuracy]


@dataclass(frozen=True)
class AccuracyCheck:
    """What the planner needs to keep a plan within an accuracy budget.

    Attributes:
        measure: The accuracy of a plan's parts (each in its precision) against fp32.
        describe: What the measurements were made on (the calibration data), for the plan.
    """

    budget: AccuracyBudget = DEFAULT_BUDGET
    measure: Measure | None = None
    describe: Callable[[], Mapping[str, Any]] = field(default=lambda: {})


def backend_precision(device: DeviceSpec, processor: str, backend: str) -> str:
    """The precision a (processor, backend) pair runs in (fp32 for a backend the spec lacks)."""
    proc = next((p for p in device.processors if p.name == processor), None)
    be = next((b for b in proc.backends if b.key == backend), None) if proc is not None else None
    return be.precision if be is not None else "fp32"


def with_precisions(plan: Plan, device: DeviceSpec) -> Plan:
    """``plan`` with each part's precision, its backend's; refuses a part in a precision its
    processor does not run (an int8-only NPU never gets an fp32 part)."""
    parts = []
    for p in plan.parts:
        precision = backend_precision(device, p.processor, p.backend)
        runs = next((q.precisions for q in device.processors if q.name == p.processor), (precision,))
        if precision not in runs:
            raise PlanError(f"part {p.name}: {p.processor} runs {list(runs)}, not {precision}")
        parts.append(replace(p, precision=precision))
    return replace(plan, parts=tuple(parts))


def reduced(plan: Plan) -> list[Part]:
    return [p for p in plan.parts if p.precision != "fp32"]


def restrict(profile: Profile, device: DeviceSpec, allowed: frozenset[str], n_nodes: int) -> Profile:
    """``profile`` with reduced-precision entries covering only ``allowed`` nodes. A calibrated
    entry (whole-model time over the sum of nodes) keeps its scale, baked into its nodes."""
    entries = []
    for e in profile.entries:
        if backend_precision(device, e.processor, e.backend) == "fp32":
            entries.append(e)
            continue
        covers = len(e.nodes) == n_nodes
        scale = e.whole_model_ms / e.sum_ms if e.whole_model_ms and covers and e.sum_ms > 0 else 1.0
        nodes = {
            k: replace(c, latency_ms=c.latency_ms * scale, p90_ms=c.p90_ms * scale)
            for k, c in e.nodes.items()
            if k in allowed
        }
        dropped = {k: "left in fp32 to meet the accuracy budget" for k in e.nodes if k not in allowed}
        entries.append(replace(e, nodes=nodes, unsupported={**e.unsupported, **dropped}, whole_model_ms=None))
    return replace(profile, entries=tuple(entries))


def _saving_ms(problem: Problem, part: Part) -> float:
    """Predicted ms the part saves against its nodes at their fastest in fp32 (profile figures)."""
    device = problem.full_device
    own = problem.profile.entry(part.processor, part.backend)
    total = 0.0
    for node in part.nodes:
        fp32 = [
            e.nodes[node].latency_ms
            for e in problem.profile.entries
            if node in e.nodes and backend_precision(device, e.processor, e.backend) == "fp32"
        ]
        mine = own.nodes[node].latency_ms if own is not None and node in own.nodes else 0.0
        total += (min(fp32) if fp32 else mine) - mine
    return total


def _alone(plan: Plan, part: Part) -> list[Part]:
    """The plan's parts with every reduced part but ``part`` in fp32."""
    return [
        p if p.name == part.name or p.precision == "fp32" else replace(p, precision="fp32")
        for p in plan.parts
    ]


def _figures(check: AccuracyCheck, plan: Plan, acc: Accuracy, steps: list) -> dict[str, Any]:
    assert check.measure is not None
    per_part = {p.name: check.measure(_alone(plan, p)).to_json() for p in reduced(plan)}
    return {
        "budget": check.budget.to_json(),
        "meets": check.budget.meets(acc),
        "measured": acc.to_json(),
        "parts": per_part,
        "dropped": steps,
        "calibration": dict(check.describe()),
    }


def fit_budget(problem: Problem, plan: Plan, solve: Callable[[Problem], Plan]) -> Plan:
    """The first plan in the sequence described in the module doc that meets the budget, with its
    measured accuracy in ``plan.accuracy`` (None when it has no reduced-precision part)."""
    check = problem.accuracy
    if check is None or check.measure is None:
        return plan
    steps: list[dict[str, Any]] = []
    n_nodes = len(problem.graph.nodes)
    baselines = plan.baselines  # of the problem as given, not of the restricted ones below
    while reduced(plan):
        acc = check.measure(plan.parts)
        if check.budget.meets(acc):
            kept = baselines if not steps else plan.baselines  # after a drop: as above
            return replace(plan, baselines=kept, accuracy=_figures(check, plan, acc, steps))
        alone = {p.name: check.measure(_alone(plan, p)) for p in reduced(plan)}
        value = {
            p.name: max(_saving_ms(problem, p), 0.0) / max(alone[p.name].noise, 1e-12) for p in reduced(plan)
        }
        worst = min(reduced(plan), key=lambda p: (value[p.name], p.name))
        steps.append(
            {
                "part": worst.name,
                "processor": worst.processor,
                "precision": worst.precision,
                "nodes": len(worst.nodes),
                "plan": acc.to_json(),
                "alone": alone[worst.name].to_json(),
                "why": "; ".join(check.budget.misses(acc)),
            }
        )
        allowed = frozenset(n for p in reduced(plan) if p.name != worst.name for n in p.nodes)
        profile = restrict(problem.profile, problem.full_device, allowed, n_nodes)
        plan = solve(replace(problem, profile=profile, accuracy=None))
    if steps:  # every reduced part dropped: the fp32 plan, with what was tried. Its baselines are
        # those of the restricted problem: one that runs the dropped nodes in reduced precision
        # (all on an int8 NPU, say) would miss the budget the plan was held to.
        return replace(plan, accuracy=_figures(check, plan, EXACT, steps))
    return plan
