"""The candidates a plan is measured against, each a real :class:`Plan` and then a real bundle.

* ``plan``: the optimiser's plan.
* ``plain-ort``: what a user gets by doing nothing, ``onnxruntime.InferenceSession(model)``: the
  whole model in ONNX Runtime over every CPU core of the device, one intra-op thread per core
  (:func:`edgesplit.device.spec.plain_cpu`: the core group of all its CPU processors, or its one CPU
  processor), each core as the spec emulates it (a little core keeps its duty cycle).
* ``only:<processor>``: the whole model as one part on one local processor with its first backend,
  one for each processor that runs every op (on big.LITTLE, ORT on the big cores only is one);
  ``only:<processor>/<backend>`` for another backend of it, when the profile predicts that backend
  faster on the whole model.
* ``ort-greedy``: ONNX Runtime's own execution-provider assignment (each node to the first
  processor whose provider takes it, accelerators first).
* ``replicas`` (throughput): a whole-model copy on each local CPU processor, requests taken from
  one queue by whichever copy is free.
* ``best-single-cut`` (Neurosurgeon) and ``server-only``: with a server, as the plan's baselines
  name them (:func:`edgesplit.optimize.baselines.baseline_candidates`).

Each candidate's plan goes through the optimiser's own :func:`~edgesplit.optimize.planner.make_plan`
(so it is priced, cut into parts and recorded like any plan), without the user's pins: baselines
model other systems. A candidate that cannot be made says why; it is listed, never dropped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgesplit.device.spec import Processor, plain_cpu
from edgesplit.errors import EdgesplitError
from edgesplit.optimize.accuracy import with_precisions
from edgesplit.optimize.baselines import baseline_candidates
from edgesplit.optimize.costs import CostModel, build_costs
from edgesplit.optimize.evaluate import feasible, sequential_cost
from edgesplit.optimize.pipeline import period_ms
from edgesplit.optimize.plan import Baseline, Plan, SolverInfo
from edgesplit.optimize.planner import make_plan
from edgesplit.optimize.schedule import schedule
from edgesplit.optimize.solve import Outcome
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.resolve import Problem

PLAN = "plan"
PLAIN_ORT = "plain-ort"
ORT_GREEDY = "ort-greedy"
REPLICAS = "replicas"
REMOTE_BASELINES = ("best-single-cut", "server-only")


@dataclass(frozen=True)
class Candidate:
    """One thing to measure: a plan (None when it cannot be made, then ``error`` says why).

    Attributes:
        same_as: The earlier candidate whose plan has exactly these parts (measured once, as that).
        bundle: Where its bundle was compiled (None before, or when it could not be).
    """

    name: str
    summary: str
    plan: Plan | None
    error: str | None = None
    same_as: str | None = None
    bundle: Path | None = None

    @property
    def remote(self) -> bool:
        return self.plan is not None and any(p.remote for p in self.plan.parts)

    @property
    def measurable(self) -> bool:
        return self.plan is not None and self.error is None and self.same_as is None


def signature(plan: Plan) -> tuple:
    """What makes two bundles the same: their parts' processors, backends and nodes, and copies."""
    return (*((p.processor, p.backend, p.remote, p.nodes) for p in plan.parts), plan.replicas)


def plan_for(
    problem: Problem,
    cm: CostModel,
    assign: np.ndarray,
    name: str,
    summary: str,
    baselines: Sequence[Baseline],
) -> Plan:
    """The plan of one baseline assignment, made as the optimiser makes its own (no pins), each part
    in its backend's precision (an int8-only NPU's part is int8; its accuracy is measured with the
    other candidates', :mod:`edgesplit.workflows.verify.accuracy`)."""
    out = Outcome(
        assign=assign,
        schedule=schedule(cm, assign),
        period_ms=period_ms(cm, assign),
        sequential_latency_ms=sequential_cost(cm, assign, "latency"),
        solver=SolverInfo(f"baseline:{name}", 0.0, False, None, "makespan", summary),
        baselines=tuple(baselines),
        baseline_assign={},
    )
    return with_precisions(make_plan(replace(problem, pins={}), cm, out), problem.full_device)


def _costs(problem: Problem, profile=None) -> CostModel:
    return build_costs(
        problem.graph,
        profile or problem.profile,
        problem.full_device,
        server=problem.server,
        link=problem.link,
    )


def _unsupported(cm: CostModel, p: int) -> str | None:
    bad = np.flatnonzero(~np.isfinite(cm.node_ms[:, p]))
    if not len(bad):
        return None
    ops = sorted({cm.op_types[i] for i in bad})
    return (
        f"cannot run {len(bad)} of {cm.n_nodes} nodes "
        f"({', '.join(ops[:4])}{' ...' if len(ops) > 4 else ''})"
    )


def _whole_on(problem: Problem, proc: Processor, backend: str, name: str, base: Plan) -> Candidate:
    """The whole model as one part on ``proc`` with ``backend`` alone."""
    summary = f"all {len(problem.graph.nodes)} nodes on {proc.name} with {backend}"
    prof = problem.profile
    if prof.entry(proc.name, backend) is None:
        return Candidate(name, summary, None, f"the profile has no {proc.name}/{backend} entry")
    wanted = f"{proc.name}/{backend}"  # this processor keeps only this backend's entry
    only = tuple(e for e in prof.entries if e.key == wanted or e.processor != proc.name)
    try:
        cm = _costs(problem, replace(prof, entries=only))
    except EdgesplitError as e:
        return Candidate(name, summary, None, str(e))
    p = cm.proc_index(proc.name)
    whole = np.full(cm.n_nodes, p, dtype=np.int64)
    why = _unsupported(cm, p) or (
        None if feasible(cm, whole, pins=False) else "does not fit its memory"
    )
    if why:
        return Candidate(name, summary, None, why)
    return Candidate(name, summary, plan_for(problem, cm, whole, name, summary, base.baselines))


def single_processor(problem: Problem, plan: Plan) -> list[Candidate]:
    """For each local processor: its first backend, and any other predicted faster on the whole
    model."""
    out = []
    for proc in problem.full_device.processors:
        if proc.is_remote:
            continue
        keys = [b.key for b in proc.backends]
        first = _whole_on(problem, proc, keys[0], f"only:{proc.name}", plan)
        out.append(first)
        best = first.plan.predicted.latency_ms if first.plan else None
        for key in keys[1:]:
            other = _whole_on(problem, proc, key, f"only:{proc.name}/{key}", plan)
            ms = other.plan.predicted.latency_ms if other.plan is not None else None
            faster = ms is not None and (best is None or ms < best)
            if faster:
                out.append(other)
    return out


def plain_ort(problem: Problem, plan: Plan) -> list[Candidate]:
    """``plain-ort`` (see the module doc); none when the device has no such processor."""
    proc = plain_cpu(problem.full_device)
    if proc is None:
        return []
    cores = f"cores {', '.join(map(str, proc.cores))}, " if proc.cores else ""
    threads = proc.threads or (len(proc.cores) if proc.cores else None)
    summary = (
        f"ONNX Runtime's defaults over every CPU core ({proc.name}: "
        f"{cores}{threads or 'all'} threads)"
    )
    c = _whole_on(problem, proc, "ort", PLAIN_ORT, plan)
    return [replace(c, summary=summary if c.plan is not None else c.summary)]


def ort_greedy(problem: Problem, plan: Plan) -> list[Candidate]:
    """``ort-greedy`` (see the module doc), on the device's own processors."""
    cm = _costs(problem)
    found = [c for c in baseline_candidates(cm, "latency") if c.name == ORT_GREEDY]
    if not found or found[0].assign is None:
        why = found[0].summary if found else "no assignment"
        return [Candidate(ORT_GREEDY, why, None, why)]
    c = found[0]
    return [
        Candidate(
            ORT_GREEDY,
            c.summary,
            plan_for(problem, cm, c.assign, ORT_GREEDY, c.summary, plan.baselines),
        )
    ]


def replicas(problem: Problem, singles: list[Candidate]) -> list[Candidate]:
    """``replicas`` (see the module doc), from the single-processor candidates of CPU processors
    that are not core groups: the first such copy, and one on each other processor of its
    precision. The predicted period is the copies' combined rate's."""
    device = problem.full_device
    cpus = [
        c for c in singles
        if c.plan is not None and c.name.startswith("only:") and "/" not in c.name
        and not device.processor(c.name[5:]).is_group and device.processor(c.name[5:]).kind == "cpu"
    ]  # fmt: skip
    if len(cpus) < 2:
        return []
    first = cpus[0].plan
    assert first is not None
    same = [
        c
        for c in cpus[1:]
        if c.plan is not None and c.plan.parts[0].precision == first.parts[0].precision
    ]
    if not same:
        return []
    procs = [first.parts[0].processor] + [c.plan.parts[0].processor for c in same]  # type: ignore[union-attr]
    periods = [c.plan.predicted.period_ms for c in [cpus[0], *same]]  # type: ignore[union-attr]
    rates = [1.0 / ms for ms in periods if ms]
    period = 1.0 / sum(rates) if rates else None
    predicted = first.predicted
    if period:
        per_s = round(1000.0 / period, 6)
        predicted = replace(predicted, period_ms=round(period, 6), throughput_per_s=per_s)
    summary = f"a whole-model copy on each of {', '.join(procs)}, one queue"
    plan = replace(first, replicas=tuple(procs[1:]), predicted=predicted)
    return [Candidate(REPLICAS, summary, plan)]


def remote_baselines(problem: Problem, plan: Plan, metric: str) -> list[Candidate]:
    """``best-single-cut`` and ``server-only`` (with a server): the plan's baselines, as plans."""
    cm = _costs(problem)
    if not cm.remote.any():
        return []
    form = "energy" if metric == "energy" else "latency"

    def score(a: np.ndarray) -> float:
        if metric == "throughput":
            return period_ms(cm, a)
        s = schedule(cm, a)
        return s.energy_mj if form == "energy" else s.makespan_ms

    found = baseline_candidates(cm, form)
    out = []
    for name in REMOTE_BASELINES:
        mine = [c for c in found if c.name == name]
        runnable = [c for c in mine if c.assign is not None]
        if not runnable:
            why = mine[0].summary if mine else "no server processor runs every op"
            out.append(Candidate(name, why, None, why))
            continue
        best = min(runnable, key=lambda c: score(c.assign))
        out.append(
            Candidate(
                name,
                best.summary,
                plan_for(problem, cm, best.assign, name, best.summary, plan.baselines),
            )
        )
    return out


def candidates(problem: Problem, plan: Plan, metric: str) -> list[Candidate]:
    """The plan first, then the baselines; identical plans marked ``same_as`` the first of them."""
    made = [Candidate(PLAN, f"the optimiser's plan, {len(plan.parts)} parts", plan)]
    made += plain_ort(problem, plan)
    singles = single_processor(problem, plan)
    made += singles
    made += ort_greedy(problem, plan)
    if metric == "throughput":
        made += replicas(problem, singles)
    made += remote_baselines(problem, plan, metric)
    seen: dict[tuple, str] = {}
    out = []
    for c in made:
        if c.plan is not None:
            sig = signature(c.plan)
            if sig in seen:
                c = replace(c, same_as=seen[sig])
            else:
                seen[sig] = c.name
        out.append(c)
    return out


def compile_candidates(
    problem: Problem,
    cands: Sequence[Candidate],
    stage: Path,
    *,
    tune_trials: int = 0,
    tune=None,
    progress: Callable[[str, int, int], None] | None = None,
    bands: bool = False,
    check_accuracy: bool = True,
) -> list[Candidate]:
    """Each measurable candidate's bundle under ``stage``; a baseline that fails to compile says
    why.

    ``check_accuracy``: compile's own check of int8/fp16 parts (off when the verification measures
    every candidate's accuracy itself).

    ``bands``: the plan's own bundle also gets a plan per bandwidth band (an adaptive bundle, when a
    server is in it); baselines never do. Every candidate is measured on its default plan.

    Raises:
        CompileError, PlanError: when the plan itself cannot be compiled (as without verification).
    """
    out = []
    for k, c in enumerate(cands):
        if not c.measurable:
            out.append(c)
            continue
        where = stage / f"c{k}"
        try:
            compile_bundle(
                problem.graph,
                c.plan,
                where,
                device=problem.full_device,
                tune_trials=tune_trials,
                tune=tune,  # TuneOptions: the kernels are tuned once, with the first candidate
                bands=bands and c.name == PLAN,
                problem=problem if c.name == PLAN else None,
                accuracy_budget=problem.accuracy.budget if problem.accuracy is not None else None,
                check_accuracy=check_accuracy,
            )
        except EdgesplitError as e:
            if c.name == PLAN:
                raise
            out.append(replace(c, error=f"cannot be compiled: {e}"))
            continue
        out.append(replace(c, bundle=where))
        if progress:
            progress("verify: compile", k + 1, len(cands))
    return out


def stage_dir(out: str | os.PathLike) -> Path:
    """A fresh folder beside ``out`` for the candidates' bundles (same file system: moves are
    renames)."""
    import tempfile

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.verify.", dir=path.parent))
