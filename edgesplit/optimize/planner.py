"""From a resolved :class:`Problem` to a :class:`Plan`: costs, solve, and the plan's parts.

The public ``partition`` (paths and names in, a plan out) is
:func:`edgesplit.workflows.resolve.partition`,
which resolves and checks the problem once and then calls :func:`solve_plan` here.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.optimize.accuracy import fit_budget, with_precisions
from edgesplit.optimize.costs import CostModel, build_costs
from edgesplit.optimize.evaluate import sequential_cost
from edgesplit.optimize.load import loaded_costs
from edgesplit.optimize.objectives import objective
from edgesplit.optimize.pipeline import period_ms
from edgesplit.optimize.plan import Baseline, Part, Plan, Predicted, Transfer
from edgesplit.optimize.problem import Problem
from edgesplit.optimize.schedule import schedule
from edgesplit.optimize.solve import Outcome, solve


def solve_plan(problem: Problem, *, time_limit_s: float = 60.0, max_evals: int = 300) -> Plan:
    """Split ``problem.graph`` over its device's processors (and the server's) for its objective.

    Pure: the problem is resolved and checked already (:func:`edgesplit.workflows.resolve.resolve`);
    the
    public entry point from paths and names is :func:`edgesplit.workflows.resolve.partition`.

    With ``problem.server_load``, server nodes are priced with the queueing delay of that many
    devices sharing the server (:mod:`edgesplit.optimize.load`); the plan's ``predicted`` records
    ``server_devices``, ``server_slots`` and ``server_queue_factor`` (time at the server over
    service time).

    Returns:
        The plan, with the baselines predicted by the same cost model; with reduced-precision
        parts, only where the whole plan meets ``problem.accuracy``'s budget (measured, see
        :mod:`edgesplit.optimize.accuracy`).

    Raises:
        PlanError: an unknown processor or node in the pins, ops no processor supports (all
            listed), an SLO that cannot be met (with the best latency).
    """

    def run(costs: CostModel) -> Outcome:
        return solve(
            costs,
            problem.objective,
            slo_ms=problem.slo_ms,
            time_limit_s=time_limit_s,
            max_evals=max_evals,
        )

    load = problem.server_load
    if load is None or problem.server is None:
        plan = _fewest_backends(problem, run)
    else:
        plan = _loaded(problem, costs_of(problem), run)
    if (
        objective(problem.objective).splits_operators
        and not problem.pins
        and problem.split_operators
    ):
        plan = with_splits(problem, plan)
    plan = with_precisions(plan, problem.full_device)
    again = partial(solve_plan, time_limit_s=time_limit_s, max_evals=max_evals)
    return fit_budget(problem, plan, again)


def with_splits(problem: Problem, plan: Plan) -> Plan:
    """``plan`` with operators split between its busiest processor and another one
    (:mod:`edgesplit.optimize.split`), when the part-level schedule predicts that faster by more
    than the measured noise; else ``plan`` itself."""
    from edgesplit.optimize.split import channel_candidates, choose, pair, row_candidates

    cm = costs_of(problem)
    if any(p.remote for p in plan.parts) or any(n not in cm.nodes for n in plan.assignment):
        return plan
    assign = np.array(
        [cm.proc_index(plan.assignment[n]["processor"]) for n in cm.nodes], dtype=np.int64
    )
    ends = pair(cm, assign)
    if ends is None:
        return plan
    base_ms = float(plan.predicted.latency_ms or 0.0)
    cands = row_candidates(problem.graph, cm, *ends) + channel_candidates(problem.graph, cm, *ends)
    chosen = choose(cands, min_gain_ms=0.01 * base_ms)
    if not chosen:
        return plan
    split_plan = plan_with_splits(problem, plan, [c.split for c in chosen])
    if (split_plan.predicted.latency_ms or 0.0) >= base_ms * (1 - cm.ov.noise_rel):
        return plan
    return split_plan


def plan_with_splits(problem: Problem, plan: Plan, splits) -> Plan:
    """``plan`` with ``splits`` (:class:`edgesplit.model.pieces.Split`) written in: each piece on
    its split's processor, each join on the first piece's, every other node where ``plan`` has it;
    priced by the part-level schedule like any plan.

    Raises:
        PlanError: a split that does not fit the model, or a node ``plan`` does not place.
    """
    from edgesplit.model.pieces import rewrite
    from edgesplit.optimize.split import derived_profile, piece_nodes

    graph = rewrite(problem.graph, splits)
    split_problem = replace(
        problem, graph=graph, profile=derived_profile(problem.profile, problem.graph, graph, splits)
    )
    cm = costs_of(split_problem)
    x = np.array(
        [
            cm.proc_index(plan.assignment[n]["processor"]) if n in plan.assignment else -1
            for n in cm.nodes
        ]
    )
    for s in splits:
        for k, nodes in enumerate(piece_nodes(s, graph)):
            x[nodes] = cm.proc_index(s.processors[k])
        x[graph.index[f"{s.output}.join"]] = cm.proc_index(s.processors[0])
    if (x < 0).any():
        raise PlanError(f"the plan places no processor for {cm.nodes[int(np.argmin(x))]}")
    out = Outcome(
        assign=x,
        schedule=schedule(cm, x),
        period_ms=period_ms(cm, x),
        sequential_latency_ms=sequential_cost(cm, x, "latency"),
        solver=replace(
            plan.solver,
            name=f"{plan.solver.name}+split-operators",
            detail=f"{len(splits)} split(s)",
        ),
        baselines=plan.baselines,
        baseline_assign={},
    )
    made = make_plan(split_problem, cm, out)
    return replace(made, splits=tuple(s.to_json() for s in splits), pareto=plan.pareto)


def costs_of(problem: Problem, uniform: dict[str, str] | None = None) -> CostModel:
    """The cost model of ``problem`` (with ``uniform``: one backend per processor, see
    :func:`uniform_backends`)."""
    return build_costs(
        problem.graph,
        problem.profile,
        problem.full_device,
        server=problem.server,
        link=problem.link,
        pins=problem.pins,
        uniform=uniform,
    )


def uniform_backends(problem: Problem) -> dict[str, str]:
    """Per processor with several profiled backends, the one whose entry has the most nodes (the
    fastest in sum among those): the backend a single-processor baseline runs."""
    out = {}
    for proc in problem.full_device.processors:
        entries = [e for e in problem.profile.for_processor(proc.name) if e.nodes]
        if len(entries) > 1:
            out[proc.name] = min(entries, key=lambda e: (-len(e.nodes), e.sum_ms)).backend
    return out


def pricings(problem: Problem) -> list[CostModel]:
    """``problem``'s cost model with each node on its fastest backend, then, where a processor has
    nodes on another backend than the one :func:`uniform_backends` gives it, the same with one
    backend per processor: the two pricings a plan is weighed in (here and in band tables)."""
    cm = costs_of(problem)
    uniform = uniform_backends(problem)
    flat = costs_of(problem, uniform) if uniform else cm
    same_backends = flat.backend == cm.backend  # no processor had a node on another backend
    return [cm] if same_backends else [cm, flat]


def _fewest_backends(problem: Problem, run) -> Plan:
    """The plan with each node on its fastest backend, or with one backend per processor where
    that scores better for the objective (or within the measured noise, with fewer parts).

    Each node's backend is fixed before the solver assigns processors, so a node that one backend
    runs a little faster would cut a processor's run into parts whose hand-offs cost more than the
    node saves (squeezenet on ``host-biglittle``: five parts on ``big`` predicted 11.06 ms, ORT
    alone
    9.30 ms). Every objective is solved both ways, and the better plan kept: by the objective's
    figure, or for a trade-off (``pareto``) the one-backend plan unless the other is no worse on
    latency and on energy (its front on each node's fastest backend had squeezenet at 17.94 ms and
    71.1 mJ on ``big``, against 11.86 ms and 46.9 mJ for ORT alone there). The plan's baselines are
    each the cheaper of their two pricings (:func:`_cheaper_baselines`).
    """
    cm, *other_pricing = pricings(problem)
    try:
        out = run(cm)
    except PlanError:
        if not other_pricing:
            raise
        # an SLO the one pricing's search misses, the other's may meet (it prices fewer parts)
        (flat,) = other_pricing
        return make_plan(problem, flat, run(flat))
    obj = objective(problem.objective)
    if not other_pricing:
        return make_plan(problem, cm, out)
    (flat,) = other_pricing
    try:
        other = run(flat)
    except PlanError:
        return make_plan(problem, cm, out)
    if obj.one_figure:
        mine, theirs = [obj.value(cm)(out.assign)], [obj.value(flat)(other.assign)]
        better = theirs < mine
    else:
        # a trade-off (pareto): the plan with mixed backends is kept only where it is no worse on
        # either figure (then no baseline of either pricing dominates it: none dominates the other)
        mine = [out.schedule.makespan_ms, out.schedule.energy_mj]
        theirs = [other.schedule.makespan_ms, other.schedule.energy_mj]
        better = not (all(m <= t for m, t in zip(mine, theirs)) and mine != theirs)
    near = all(t <= m * (1 + cm.ov.noise_rel) for t, m in zip(theirs, mine))
    fewer = _n_parts(flat, other.assign) < _n_parts(cm, out.assign)
    if better or (fewer and near):
        return make_plan(problem, flat, _cheaper_baselines(other, out, obj.baseline_metric))
    return make_plan(problem, cm, _cheaper_baselines(out, other, obj.baseline_metric))


def _cheaper_baselines(kept: Outcome, dropped: Outcome, metric: str) -> Outcome:
    """``kept`` with each baseline the cheaper (by ``metric``) of its two pricings: with each node
    on
    its fastest backend (a processor's run cut into ORT and TVM parts) or with one backend per
    processor. A baseline is what a user would run instead, the whole model on one processor with
    one runtime where that is cheaper (squeezenet on ``host-biglittle``: only:big at 17.94 ms with
    ORT and TVM parts, 11.86 ms with ORT alone)."""
    figure = "energy_mj" if metric == "energy" else "latency_ms"
    other = {b.name: b for b in dropped.baselines if b.feasible}

    def cheaper(b: Baseline) -> Baseline:
        o = other.get(b.name)
        if o is None or (b.feasible and getattr(b, figure) <= getattr(o, figure)):
            return b
        return o

    return replace(kept, baselines=tuple(cheaper(b) for b in kept.baselines))


def _n_parts(cm: CostModel, assign: np.ndarray) -> int:
    return len(schedule(cm, assign).parts)


def _loaded(problem: Problem, cm: CostModel, run) -> Plan:
    """The plan with server nodes priced for ``problem.server_load`` (see :func:`solve_plan`)."""
    load = problem.server_load
    last: list[tuple[CostModel, Outcome]] = []

    def priced(costs: CostModel) -> tuple[np.ndarray, float]:
        last[:] = [(costs, run(costs))]
        return last[0][1].assign, last[0][1].schedule.makespan_ms

    loaded = loaded_costs(cm, priced, load)
    solved, outcome = last[0]
    plan = make_plan(
        problem, loaded.costs, outcome if solved is loaded.costs else run(loaded.costs)
    )
    predicted = replace(
        plan.predicted,
        server_devices=load.devices,
        server_slots=load.slots,
        server_queue_factor=round(loaded.factor, 6),
    )
    return replace(plan, predicted=predicted)


def _boundaries(cm: CostModel, part_of: np.ndarray, n_parts: int):
    """Per part: tensors read from other parts, tensors written for other parts, successor parts."""
    ins: list[dict[str, None]] = [{} for _ in range(n_parts)]
    outs: list[dict[str, None]] = [{} for _ in range(n_parts)]
    succ: list[set[int]] = [set() for _ in range(n_parts)]
    for f in cm.flows:
        src = part_of[f.src] if f.src >= 0 else -1
        for d in f.dsts:
            if part_of[d] != src:
                ins[part_of[d]][f.tensor] = None
                if src >= 0:
                    outs[src][f.tensor] = None
                    succ[src].add(int(part_of[d]))
        if f.to_home and src >= 0:
            outs[src][f.tensor] = None
    return ins, outs, succ


def _parts(
    cm: CostModel, out: Outcome, groups: list[list[int]], backends: list
) -> tuple[list[Part], np.ndarray]:
    """The parts of the chosen assignment (groups in topological order), and each node's part;
    each part's latency is its modelled run (fixed cost, nodes, boundary bytes and reorders,
    contention) and its start and end are the schedule's."""
    x, sched = out.assign, out.schedule
    part_of = np.zeros(cm.n_nodes, dtype=np.int64)
    for i, g in enumerate(groups):
        part_of[g] = i
    ins, outs, succ = _boundaries(cm, part_of, len(groups))
    stage = [0] * len(groups)
    for i in range(len(groups)):  # groups are in topological order
        for j in succ[i]:
            stage[j] = max(stage[j], stage[i] + 1)
    parts = []
    for i, g in enumerate(groups):
        p = int(x[g[0]])
        parts.append(
            Part(
                name=f"p{i}",
                processor=cm.processors[p],
                backend=backends[g[0]] or "",
                remote=bool(cm.remote[p]),
                nodes=tuple(cm.nodes[n] for n in g),
                inputs=tuple(ins[i]),
                outputs=tuple(outs[i]),
                latency_ms=round(float(sched.part_ms[i]), 6),
                energy_mj=round(float(cm.node_mj[g, p].sum()), 6),
                start_ms=round(float(sched.part_start_ms[i]), 6),
                end_ms=round(float(sched.part_end_ms[i]), 6),
                stage=stage[i],
            )
        )
    return parts, part_of


def _transfers(
    cm: CostModel, out: Outcome, parts: list[Part], part_of: np.ndarray
) -> list[Transfer]:
    """One transfer per crossing and reading part; a tensor read by several parts crosses once."""
    x = out.assign
    transfers = []
    for c in out.schedule.crossings:
        f = cm.flows[c.flow]
        src_name = parts[part_of[f.src]].name if f.src >= 0 else "input"
        readers = sorted({int(part_of[d]) for d in f.dsts if x[d] == c.dst})
        names = [parts[r].name for r in readers] + (
            ["output"] if f.to_home and c.dst == cm.home else []
        )
        for k, name in enumerate(names):
            transfers.append(
                Transfer(
                    tensor=f.tensor,
                    nbytes=int(f.nbytes),
                    src_part=src_name,
                    dst_part=name,
                    src_processor=cm.processors[c.src],
                    dst_processor=cm.processors[c.dst],
                    latency_ms=round(c.latency_ms, 6) if k == 0 else 0.0,
                    energy_mj=round(c.energy_mj, 6) if k == 0 else 0.0,
                )
            )
    return transfers


def make_plan(problem: Problem, cm: CostModel, out: Outcome) -> Plan:
    """Assemble a :class:`Plan` from a solved assignment, recording where its inputs came from."""
    x, sched = out.assign, out.schedule
    backends = [cm.backend[n][x[n]] for n in range(cm.n_nodes)]
    parts, part_of = _parts(cm, out, [list(p) for p in sched.parts], backends)
    graph, device, server = problem.graph, problem.device, problem.server
    predicted = Predicted(
        latency_ms=round(sched.makespan_ms, 6),
        energy_mj=round(sched.energy_mj, 6),
        throughput_per_s=round(1000.0 / out.period_ms, 6) if out.period_ms > 0 else 0.0,
        sequential_latency_ms=round(out.sequential_latency_ms, 6),
        period_ms=round(out.period_ms, 6),
    )
    return Plan(
        model_sha256=graph.sha256,
        model_name=graph.name,
        model_path=os.path.abspath(graph.path),
        device=device.name,
        server=server.name if server is not None else None,
        link=problem.link,
        objective=problem.objective,
        slo_ms=problem.slo_ms,
        assignment={
            cm.nodes[n]: {"processor": cm.processors[x[n]], "backend": backends[n] or ""}
            for n in range(cm.n_nodes)
        },
        parts=tuple(parts),
        transfers=tuple(_transfers(cm, out, parts, part_of)),
        predicted=predicted,
        baselines=out.baselines,
        solver=replace(out.solver, time_s=round(out.solver.time_s, 6)),
        pareto=out.pareto,
        home=cm.processors[cm.home],
        pins=dict(cm.pins),
        input_shapes={k: tuple(v) for k, v in graph.input_shapes().items()},
        device_path=_abspath(device.path),
        server_path=_abspath(server.path) if server is not None else "",
        profile_path=os.path.abspath(problem.profile_path) if problem.profile_path else None,
        server_profile_path=_abspath(problem.server_profile_path or "") or None,
        cost_sources={e.key: e.source for e in problem.profile.entries},
    )


def _abspath(path: str) -> str:
    """A spec's file as an absolute path ("" when the spec came from no file)."""
    return os.path.abspath(path) if path and os.path.isfile(path) else ""
