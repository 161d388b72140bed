"""A group's candidate plans, from the optimiser: every plan the fleet planner may give it.

For one group's :class:`~edgesplit.optimize.problem.Problem` (its model, device spec, link and
the server): each single device processor alone, the whole model on the server, every single cut
(Neurosurgeon's prefix on the device's best processor, the rest on the server), ONNX Runtime's
greedy assignment, and the solver's energy and latency plans. Each is priced by the schedule
(:func:`~edgesplit.optimize.schedule.schedule`) as a plan is, alone. Candidates no other beats on
device energy, device time and server time together are kept (at most ``max_candidates``,
spread over the energies), since a dominated one can only cost more whatever the load.

A candidate's server part is keyed by the model, the server processor and its nodes: groups whose
candidates have the same key run the same server part, so the server may batch them together.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.fleet.price import Candidate
from edgesplit.optimize.baselines import baseline_candidates
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.planner import costs_of
from edgesplit.optimize.problem import Problem
from edgesplit.optimize.schedule import schedule
from edgesplit.optimize.solve import solve

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
    cm = costs_of(problem)
    made = [
        Made(price(problem, cm, name, a), np.asarray(a, dtype=np.int64))
        for name, a in _assignments(cm, max_evals).items()
    ]
    if not made:
        raise PlanError(f"{problem.graph.name} on {problem.device.name}: no plan runs")
    return _front(made, max_candidates), cm
