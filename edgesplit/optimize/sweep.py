"""Re-solve a plan's problem at other network bandwidths, to see where the decision changes.

The plan records where its inputs came from (model path and shapes, device and server specs, the
profile path, the link and the pins), so the costs can be rebuilt; only the link's up and down
rates change from one row to the next.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgesplit.device import DeviceSpec, NetworkLink
from edgesplit.errors import PlanError
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.api import complete_profile
from edgesplit.optimize.costs import build_costs
from edgesplit.optimize.plan import Plan
from edgesplit.optimize.solve import solve
from edgesplit.profile.store import Profile


@dataclass(frozen=True)
class SweepRow:
    """The plan re-solved at one bandwidth.

    Attributes:
        decision: Which processors run how many nodes (``cpu_big:21 gpu:108``).
        changed: True where the decision differs from the previous row's.
        baselines: Baseline name -> predicted latency (``None``: cannot run).
    """

    bandwidth_mbps: float
    latency_ms: float
    energy_mj: float
    decision: str
    changed: bool
    baselines: dict[str, float | None]


@dataclass(frozen=True)
class PlanContext:
    """What a plan was made from, loaded again."""

    graph: ModelGraph
    profile: Profile
    device: DeviceSpec
    server: DeviceSpec | None
    link: NetworkLink | None


def load_context(plan: Plan) -> PlanContext:
    """Load the model, specs and profile a plan names, checking the model is the same.

    Raises:
        PlanError: when the model file is gone or has another hash than the plan's.
    """
    from pathlib import Path

    from edgesplit.device import load_device
    from edgesplit.model.load import load_model
    from edgesplit.profile.store import load_profile

    if not Path(plan.model_path).is_file():
        raise PlanError(f"the plan's model {plan.model_path} is missing")
    graph = load_model(plan.model_path, plan.input_shapes or None)
    if graph.sha256 != plan.model_sha256:
        raise PlanError(
            f"the plan is for model {plan.model_sha256[:12]}, but {plan.model_path} is "
            f"{graph.sha256[:12]} (re-run edgesplit partition)"
        )
    device = load_device(
        plan.device_path if plan.device_path and Path(plan.device_path).is_file() else plan.device
    )
    server = None
    if plan.server:
        server = load_device(
            plan.server_path if plan.server_path and Path(plan.server_path).is_file() else plan.server
        )
    full = device.with_server(server) if server is not None else device
    profile = load_profile(plan.profile_path) if plan.profile_path else None
    link = NetworkLink(**plan.link) if plan.link else None
    return PlanContext(graph, complete_profile(graph, full, profile), full, server, link)


def log_bandwidths(lo_mbps: float = 0.1, hi_mbps: float = 1000.0, per_decade: int = 4) -> list[float]:
    """Log-spaced bandwidths from ``lo_mbps`` to ``hi_mbps``."""
    n = int(round(np.log10(hi_mbps / lo_mbps) * per_decade)) + 1
    return [float(f"{b:.4g}") for b in np.logspace(np.log10(lo_mbps), np.log10(hi_mbps), n)]


def decision_of(plan_assign: np.ndarray, processors: tuple[str, ...]) -> str:
    counts = np.bincount(plan_assign, minlength=len(processors))
    return " ".join(f"{processors[p]}:{int(c)}" for p, c in enumerate(counts) if c)


def bandwidth_sweep(
    plan: Plan,
    bandwidths: list[float] | None = None,
    context: PlanContext | None = None,
    *,
    max_evals: int = 150,
) -> list[SweepRow]:
    """Re-solve ``plan``'s objective at each bandwidth (up and down set alike).

    Raises:
        PlanError: for a plan without a server (nothing crosses a network).
    """
    if not plan.server or not plan.link:
        raise PlanError(
            "the plan has no server and link, so bandwidth changes nothing (partition with --server)"
        )
    ctx = context or load_context(plan)
    rows: list[SweepRow] = []
    prev = None
    objective = "latency" if plan.objective == "pareto" else plan.objective
    for bw in bandwidths or log_bandwidths():
        assert ctx.link is not None
        link = replace(ctx.link, up_mbps=bw, down_mbps=bw, name=f"{ctx.link.name.split('@')[0]}@{bw:g}mbps")
        cm = build_costs(ctx.graph, ctx.profile, ctx.device, server=ctx.server, link=link, pins=plan.pins)
        try:
            out = solve(cm, objective, slo_ms=plan.slo_ms, max_evals=max_evals)
        except PlanError:
            continue  # an SLO this bandwidth cannot meet
        decision = decision_of(out.assign, cm.processors)
        rows.append(
            SweepRow(
                bw,
                round(out.schedule.makespan_ms, 6),
                round(out.schedule.energy_mj, 6),
                decision,
                prev is not None and decision != prev,
                {b.name: b.latency_ms for b in out.baselines},
            )
        )
        prev = decision
    return rows
