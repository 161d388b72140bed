"""A group's candidate plans, from the optimiser: every plan the fleet planner may give it.

For one group's :class:`~edgesplit.optimize.problem.Problem` (its model, device spec, link and
the server): each single device processor alone, the whole model on the server, every single cut
(Neurosurgeon's prefix on the device's best processor, the rest on the server), ONNX Runtime's
greedy assignment, and the solver's energy and latency plans. Each is priced by the schedule
(:func:`~edgesplit.optimize.schedule.schedule`) as a plan is, alone. Candidates no other beats on
device energy, device time and server time together are kept (at most ``max_candidates``,
spread over the energies), since a dominated one can only cost more whatever the load.

Reduced precision is held to the problem's accuracy budget, as ``partition`` holds its plans:
each candidate with int8 or fp16 parts is measured whole against fp32. Where one misses the
budget, reduced precision is allowed only on the nodes that candidates meeting it run that way
(none: the group is planned in fp32), the candidates are made again on those costs and measured
again, and any that still misses is dropped. So an int8 NPU plan that ``partition`` would refuse
is never offered to the fleet, and the fp32 plans it would fall back on are.

A candidate's server part is keyed by the model, the server processor and its nodes: groups whose
candidates have the same key run the same server part, so the server may batch them together.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.fleet.price import Candidate
from edgesplit.optimize.accuracy import reduced, restrict, with_precisions
from edgesplit.optimize.baselines import baseline_candidates
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import sequential_cost
from edgesplit.optimize.pipeline import period_ms
from edgesplit.optimize.plan import Plan, SolverInfo
from edgesplit.optimize.planner import costs_of, make_plan
from edgesplit.optimize.problem import Problem
from edgesplit.optimize.schedule import schedule
from edgesplit.optimize.solve import Outcome, solve

MAX_CANDIDATES = 12


@dataclass(frozen=True)
class Made:
    """A candidate and the assignment it prices (node -> processor index of ``costs``)."""

    candidate: Candidate
    assign: np.ndarray


def _key(problem: Problem, cm: CostModel, assign: np.ndarray) -> str | None:
    on = cm.remote[assign]
    if not on.any():
        return None
    procs = sorted({cm.processors[p] for p in assign[on]})
    nodes = "\n".join(cm.nodes[n] for n in np.flatnonzero(on))
    digest = hashlib.sha256(nodes.encode()).hexdigest()[:10]
    return f"{problem.graph.name}@{problem.graph.sha256[:8]}/{'+'.join(procs)}/{digest}"


def _shared_ms(problem: Problem, cm: CostModel, assign: np.ndarray) -> float:
    """The server part's weight-bound share: per server node, the time to read its weights at the
    processor's memory bandwidth (at most the node's time); a batch reads them once."""
    procs = {p.name: p for p in problem.full_device.processors}
    total = 0.0
    for n in np.flatnonzero(cm.remote[assign]):
        p = int(assign[n])
        node = problem.graph.nodes[problem.graph.index[cm.nodes[n]]]
        gbps = procs[cm.processors[p]].mem_bandwidth_gbps
        read_ms = node.weight_nbytes / (gbps * 1e6) if gbps > 0 else 0.0
        total += min(float(cm.node_ms[n, p]), read_ms)
    return total


def price(problem: Problem, cm: CostModel, name: str, assign: np.ndarray) -> Candidate:
    """``assign`` as a candidate, priced alone."""
    sched = schedule(cm, assign)
    on = cm.remote[assign]
    server_ms = float(cm.node_ms[np.arange(cm.n_nodes), assign][on].sum())
    return Candidate(
        name=name,
        key=_key(problem, cm, assign),
        device_ms=max(0.0, float(sched.makespan_ms) - server_ms),
        energy_mj=float(sched.energy_mj),
        idle_w=float(cm.idle_total_w),
        server_ms=server_ms,
        shared_ms=_shared_ms(problem, cm, assign) if on.any() else 0.0,
    )


def plan_of(problem: Problem, cm: CostModel, assign: np.ndarray, detail: str = "") -> Plan:
    """``assign`` as a :class:`~edgesplit.optimize.plan.Plan` of ``problem`` (solver ``fleet``),
    each part in its backend's precision."""
    info = SolverInfo("fleet", 0.0, False, None, "makespan", detail)
    out = Outcome(
        assign,
        schedule(cm, assign),
        period_ms(cm, assign),
        sequential_cost(cm, assign, "latency"),
        info,
        (),
        {},
    )
    return with_precisions(make_plan(problem, cm, out), problem.full_device)


def _measured(problem: Problem, cm: CostModel, made: list[Made]) -> tuple[list[Made], set, bool]:
    """The candidates that meet the problem's accuracy budget (all-fp32 ones always do), the nodes
    they run in reduced precision, and whether any missed."""
    check = problem.accuracy
    assert check is not None and check.measure is not None
    kept, nodes, missed = [], set(), False
    for m in made:
        plan = plan_of(problem, cm, m.assign)
        parts = reduced(plan)
        if parts and not check.budget.meets(check.measure(plan.parts)):
            missed = True
            continue
        kept.append(m)
        nodes.update(n for p in parts for n in p.nodes)
    return kept, nodes, missed


def _assignments(cm: CostModel, max_evals: int) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    for c in baseline_candidates(cm, "energy", keep_cuts=cm.n_nodes + 1):
        if c.assign is None:
            continue
        name = c.name
        if name == "best-single-cut":
            name = f"cut@{int((~cm.remote[c.assign]).sum())}"
        found.setdefault(name, c.assign)
    for obj in ("energy", "latency"):
        try:
            found[f"solver:{obj}"] = solve(cm, obj, max_evals=max_evals).assign
        except PlanError:
            continue
    unique: dict[bytes, str] = {}
    for name, a in found.items():
        unique.setdefault(np.asarray(a, dtype=np.int64).tobytes(), name)
    return {name: found[name] for name in unique.values()}


def _front(made: list[Made], limit: int) -> list[Made]:
    """The candidates no other beats on energy, device time and server time at once (for a
    server part: one with the same key, or none), at most ``limit``, spread over the energies."""

    def figures(m: Made) -> tuple[float, float, float]:
        c = m.candidate
        return (c.energy_mj, c.device_ms, c.server_ms)

    kept = []
    for m in made:
        f = figures(m)
        beaten = any(
            o is not m
            and all(a <= b for a, b in zip(figures(o), f))
            and figures(o) != f
            and (o.candidate.key is None or o.candidate.key == m.candidate.key)
            for o in made
        )
        if not beaten:
            kept.append(m)
    kept.sort(key=lambda m: figures(m))
    if len(kept) <= limit:
        return kept
    picks = np.unique(np.linspace(0, len(kept) - 1, limit).round().astype(int))
    return [kept[i] for i in picks]


def group_candidates(
    problem: Problem, *, max_candidates: int = MAX_CANDIDATES, max_evals: int = 150
) -> tuple[list[Made], CostModel]:
    """The candidate plans of one group's problem (see the module doc), and their cost model.

    Raises:
        PlanError: for a problem without a server, or with no plan that runs.
    """
    if problem.server is None:
        raise PlanError("a fleet group needs the server (its spec in the fleet file)")
    allowed: frozenset[str] | None = None  # nodes reduced precision may run (None: all)
    while True:
        costed = problem
        if allowed is not None:
            n_nodes = len(problem.graph.nodes)
            profile = restrict(problem.profile, problem.full_device, allowed, n_nodes)
            costed = replace(problem, profile=profile)
        cm = costs_of(costed)
        made = [
            Made(price(costed, cm, name, a), np.asarray(a, dtype=np.int64))
            for name, a in _assignments(cm, max_evals).items()
        ]
        check = problem.accuracy
        if check is None or check.measure is None:
            break
        made, nodes, missed = _measured(costed, cm, made)
        if not missed or (allowed is not None and nodes >= allowed):
            break
        allowed = frozenset(nodes)
    if not made:
        raise PlanError(f"{problem.graph.name} on {problem.device.name}: no plan runs")
    return _front(made, max_candidates), cm
