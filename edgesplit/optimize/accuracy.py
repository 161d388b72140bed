"""The accuracy budget of a plan: reduced-precision parts only where the whole plan meets it.

Pure: the measuring is handed in (:class:`AccuracyCheck`, built by
:mod:`edgesplit.workflows.resolve` on
:class:`edgesplit.precision.measure.PlanMeasurer`); nothing here runs a model.

:func:`fit_budget` starts from the plan the objective chose and measures it whole. While it
misses the budget, it measures each *unit* alone (the rest in fp32) and drops the least valuable
one: the one that saves the fewest predicted ms per unit of noise it adds (noise power over signal
power, plus changed top-1 classes). A unit is a reduced-precision (int8, fp16) part, or for a part
of at least ``2 * MIN_UNIT_NODES`` nodes, a run of its consecutive nodes (up to ``MAX_UNITS`` runs
of near-equal length): a whole model in one int8 part then loses its noisiest quarter, not all of
its int8. Dropping a unit means re-solving with reduced precision allowed only on the plan's
other reduced nodes, so the next plan's reduced nodes are a strict subset of this one's. The
sequence of plans does not depend on
the budget, and a budget stops it at the first plan that meets it: a tighter budget stops later,
so it never has more reduced-precision nodes. An all-fp32 plan meets every budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from edgesplit.device.spec import DeviceSpec
from edgesplit.errors import PlanError
from edgesplit.model.graph import ModelGraph, part_boundaries
from edgesplit.optimize.plan import Baseline, Part, Plan
from edgesplit.precision.metrics import DEFAULT_BUDGET, EXACT, Accuracy, AccuracyBudget
from edgesplit.precision.record import AccuracyRecord, CalibrationRecord, DroppedPart
from edgesplit.profile.store import Profile
from edgesplit.util import Progress, known_fields

if TYPE_CHECKING:
    from edgesplit.optimize.problem import Problem

Measure = Callable[[Sequence[Part]], Accuracy]
PROGRESS_LABEL = "accuracy budget"


@dataclass(frozen=True)
class AccuracyCheck:
    """What the planner needs to keep a plan within an accuracy budget.

    Attributes:
        measure: The accuracy of a plan's parts (each in its precision) against fp32.
        describe: What the measurements were made on (the calibration data), for the plan.
        progress: Told ``(PROGRESS_LABEL, measured, to measure)`` while the units of a plan that
            misses the budget are measured one by one (minutes on a big model).
    """

    budget: AccuracyBudget = DEFAULT_BUDGET
    measure: Measure | None = None
    describe: Callable[[], Mapping[str, Any]] = field(default=lambda: {})
    progress: Progress | None = None


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
        runs = next(
            (q.precisions for q in device.processors if q.name == p.processor), (precision,)
        )
        if precision not in runs:
            raise PlanError(f"part {p.name}: {p.processor} runs {list(runs)}, not {precision}")
        parts.append(replace(p, precision=precision))
    return replace(plan, parts=tuple(parts))


def reduced(plan: Plan) -> list[Part]:
    return [p for p in plan.parts if p.precision != "fp32"]


def restrict(
    profile: Profile, device: DeviceSpec, allowed: frozenset[str], n_nodes: int
) -> Profile:
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
        dropped = {
            k: "left in fp32 to meet the accuracy budget" for k in e.nodes if k not in allowed
        }
        entries.append(
            replace(e, nodes=nodes, unsupported={**e.unsupported, **dropped}, whole_model_ms=None)
        )
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


MIN_UNIT_NODES = 8
MAX_UNITS = 4


def units(graph: ModelGraph, part: Part) -> list[Part]:
    """``part`` as the units the budget drops (see the module doc), each a part of its own."""
    n = len(part.nodes)
    pieces = min(MAX_UNITS, n // MIN_UNIT_NODES)
    if pieces < 2:
        return [part]
    out = []
    for k in range(pieces):
        nodes = part.nodes[k * n // pieces : (k + 1) * n // pieces]
        [(inputs, outputs)] = part_boundaries(graph, [[graph.index[x] for x in nodes]])
        out.append(
            replace(
                part,
                name=f"{part.name}.{k}",
                nodes=nodes,
                inputs=tuple(inputs),
                outputs=tuple(outputs),
            )
        )
    return out


def _alone(plan: Plan, unit: Part, graph: ModelGraph) -> list[Part]:
    """The plan's parts with every reduced node but ``unit``'s in fp32 (its part cut into units)."""
    out = []
    for p in plan.parts:
        if unit.nodes[0] not in p.nodes:
            out.append(p if p.precision == "fp32" else replace(p, precision="fp32"))
            continue
        for u in units(graph, p) if unit.name != p.name else [p]:
            out.append(u if u.name == unit.name else replace(u, precision="fp32"))
    return out


def _figures(
    check: AccuracyCheck, plan: Plan, acc: Accuracy, steps: list[DroppedPart], graph: ModelGraph
) -> AccuracyRecord:
    assert check.measure is not None
    per_part = {p.name: _as_written(check.measure(_alone(plan, p, graph))) for p in reduced(plan)}
    return AccuracyRecord(
        budget=check.budget,
        meets=check.budget.meets(acc),
        measured=_as_written(acc),
        parts=per_part,
        dropped=tuple(steps),
        calibration=CalibrationRecord(**known_fields(CalibrationRecord, check.describe())),
    )


def _as_written(acc: Accuracy) -> Accuracy:
    """``acc`` as the plan's JSON holds it (6 digits), so that a plan read back is equal."""
    return Accuracy.from_json(acc.to_json())


def _measure_alone(
    check: AccuracyCheck, plan: Plan, cands: list[Part], graph: ModelGraph
) -> dict[str, Accuracy]:
    """Each unit of ``cands`` measured alone (see :func:`_alone`), with progress."""
    assert check.measure is not None
    out = {}
    for i, u in enumerate(cands):
        if check.progress is not None:
            check.progress(PROGRESS_LABEL, i, len(cands))
        out[u.name] = check.measure(_alone(plan, u, graph))
    if check.progress is not None:
        check.progress(PROGRESS_LABEL, len(cands), len(cands))
    return out


def fit_budget(problem: Problem, plan: Plan, solve: Callable[[Problem], Plan]) -> Plan:
    """The first plan in the sequence described in the module doc that meets the budget, with its
    measured accuracy in ``plan.accuracy`` (None when it has no reduced-precision part)."""
    check = problem.accuracy
    if check is None or check.measure is None:
        return plan
    steps: list[DroppedPart] = []
    n_nodes = len(problem.graph.nodes)
    baselines = plan.baselines  # of the problem as given, not of the restricted ones below
    while reduced(plan):
        acc = check.measure(plan.parts)
        if check.budget.meets(acc):
            kept = baselines if not steps else _restricted(plan.baselines)  # after a drop
            return replace(
                plan, baselines=kept, accuracy=_figures(check, plan, acc, steps, problem.graph)
            )
        cands = [u for p in reduced(plan) for u in units(problem.graph, p)]
        alone = _measure_alone(check, plan, cands, problem.graph)
        value = {
            u.name: max(_saving_ms(problem, u), 0.0) / max(alone[u.name].noise, 1e-12)
            for u in cands
        }
        worst = min(cands, key=lambda u: (value[u.name], u.name))
        steps.append(
            DroppedPart(
                part=worst.name,
                processor=worst.processor,
                precision=worst.precision,
                nodes=len(worst.nodes),
                plan=_as_written(acc),
                alone=_as_written(alone[worst.name]),
                why="; ".join(check.budget.misses(acc)),
            )
        )
        allowed = frozenset(n for p in reduced(plan) for n in p.nodes) - set(worst.nodes)
        profile = restrict(problem.profile, problem.full_device, allowed, n_nodes)
        plan = solve(replace(problem, profile=profile, accuracy=None))
    if steps:  # every reduced part dropped: the fp32 plan, with what was tried. Its baselines are
        # those of the restricted problem: one that runs the dropped nodes in reduced precision
        # (all on an int8 NPU, say) would miss the budget the plan was held to.
        return replace(
            plan,
            baselines=_restricted(plan.baselines),
            accuracy=_figures(check, plan, EXACT, steps, problem.graph),
        )
    return plan


def _restricted(baselines: Sequence[Baseline]) -> tuple[Baseline, ...]:
    """The baselines of a problem whose reduced precision the budget cut back, saying so where it
    matters: ORT's own assignment puts every node a provider takes on it, in reduced precision; the
    one priced here has reduced precision only where the budget left it (``deploy``'s verification
    measures ORT's own, with its accuracy)."""
    note = " (reduced precision only where the budget keeps it; deploy measures ORT's own)"
    return tuple(
        replace(b, assignment_summary=b.assignment_summary + note) if b.name == "ort-greedy" else b
        for b in baselines
    )
