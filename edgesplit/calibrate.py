"""``calibrate``: run a bundle, refit its profile's cost terms from the measured part runs, repeat.

The loop closes the truth cycle (DESIGN.md): the bundle's plan names the profile it was made from
(or ``profile`` is given); each round runs the bundle through the real :class:`Session`, reduces
its timing records (:func:`measure`), and fits the terms (:func:`edgesplit.optimize.calibrate.
fit_profile`) on every round's runs so far, always starting from the profile as measured. A round
first predicts its fresh runs with the terms fitted before it: the loop has converged when that
prediction is within ``tolerance`` of the measurement. ``edgesplit calibrate`` writes the result;
``partition --profile`` then plans with it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesplit.compile.bundle import open_bundle
from edgesplit.device import NetworkLink, load_device
from edgesplit.errors import InputError, PlanError
from edgesplit.optimize.api import complete_profile
from edgesplit.optimize.calibrate import Measured, PairFit, fit_profile, uncalibrated
from edgesplit.optimize.costs import CostModel, build_costs
from edgesplit.optimize.plan import Plan
from edgesplit.optimize.schedule import schedule
from edgesplit.pipeline import load_graph, plan_device
from edgesplit.profile.store import Profile, load_profile
from edgesplit.runtime.session import load
from edgesplit.runtime.trace import Trace

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Round:
    """One round: the plan's latency predicted with the terms fitted before it, and measured.

    ``error`` is ``measured / predicted - 1``.
    """

    number: int
    predicted_ms: float
    measured_ms: float
    error: float
    fits: tuple[PairFit, ...] = ()


@dataclass(frozen=True)
class Calibration:
    """The calibrated profile and how it came about.

    Attributes:
        converged_after: Fitting rounds until a round's fresh runs were predicted within the
            tolerance (None: not within ``max_rounds``).
        predicted_ms: The plan's latency predicted with the final profile.
    """

    profile: Profile
    rounds: tuple[Round, ...]
    converged_after: int | None
    predicted_ms: float
    tolerance: float


def measure(
    bundle: str | os.PathLike, runs: int = 30, warmup: int = 5, *, trust_key: str | os.PathLike | None = None
) -> Measured:
    """Run ``bundle`` ``runs`` times (after ``warmup``) and reduce its records for the fit
    (``trust_key``: the bundle must be signed by it, as for :func:`~edgesplit.runtime.session.load`)."""
    from edgesplit.runtime.api import random_feeds

    with load(bundle, trust_key=trust_key) as sess:
        feeds = random_feeds(sess)
        for _ in range(warmup):
            sess.run(feeds)
        sess.reset_stats()
        wall = []
        for _ in range(runs):
            t0 = time.perf_counter()
            sess.run(feeds)
            wall.append((time.perf_counter() - t0) * 1e3)
        trace = sess.trace_records()
    return reduce_trace(trace, wall)


def reduce_trace(trace: Trace, wall_ms: list[float]) -> Measured:
    """Medians per part (start to done on its worker), every hand-off with the idle gap before it,
    and the requests' latency as timed by the caller and as the records cover it."""
    spans: dict[str, list[float]] = {}
    for p in trace.parts:
        spans.setdefault(p.part, []).append(p.span_ns / 1e6)
    handoffs = []
    for lane in trace.lanes:
        if lane.startswith("remote:"):
            continue
        last_done = None
        for p in sorted((r for r in trace.parts if r.lane == lane), key=lambda r: r.start_ns):
            if p.worker_idle and last_done is not None and p.handoff_ns is not None:
                handoffs.append((p.processor, (p.submit_ns - last_done) / 1e6, p.handoff_ns / 1e6))
            last_done = p.done_ns if last_done is None else max(last_done, p.done_ns)
    return Measured(
        {k: float(np.median(v)) for k, v in spans.items()},
        tuple(handoffs),
        float(np.median(wall_ms)),
        float(np.median([r.latency_ns / 1e6 for r in trace.requests])),
        len(wall_ms),
        {k: float(np.percentile(v, 90)) for k, v in spans.items()},
    )


@dataclass(frozen=True, eq=False)
class PlanCosts:
    """A bundle's plan priced under a profile: the cost model, the plan's assignment and its parts
    (node indices, the bundle's order) with their names."""

    cm: CostModel
    assign: np.ndarray
    parts: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]

    def latency_ms(self) -> float:
        return schedule(self.cm, self.assign, self.parts).makespan_ms


def plan_costs(plan: Plan, profile: Profile) -> PlanCosts:
    """The plan's problem under ``profile``, each node on the processor and backend the plan gave it.

    Raises:
        PlanError: when the plan's model file is gone.
    """
    if not Path(plan.model_path).is_file():
        raise PlanError(f"the plan's model {plan.model_path} is missing")
    graph = load_graph(plan.model_path, plan.input_shapes or None)
    full = plan_device(plan)
    server = None
    if plan.server:
        server = load_device(
            plan.server_path if plan.server_path and Path(plan.server_path).is_file() else plan.server
        )
    link = NetworkLink(**plan.link) if plan.link else None
    cm = build_costs(
        graph,
        complete_profile(graph, full, profile),
        full,
        server=server,
        link=link,
        assignment=plan.assignment,
    )
    assign = np.array([cm.proc_index(plan.assignment[n]["processor"]) for n in cm.nodes], dtype=np.int64)
    index = {n: i for i, n in enumerate(cm.nodes)}
    parts = tuple(tuple(index[n] for n in p.nodes) for p in plan.parts)
    return PlanCosts(cm, assign, parts, tuple(p.name for p in plan.parts))


def base_profile(
    bundle: str | os.PathLike,
    profile: Profile | str | os.PathLike | None,
    trust_key: str | os.PathLike | None = None,
) -> tuple[Plan, Profile]:
    """The bundle's plan and the profile to calibrate: ``profile`` if given, else the one the
    plan names.

    Raises:
        InputError: when neither is there.
    """
    plan = open_bundle(bundle, trust_key=trust_key).plan
    if profile is None:
        if not plan.profile_path or not Path(plan.profile_path).is_file():
            named = f" ({plan.profile_path} is missing)" if plan.profile_path else ""
            raise InputError(f"{bundle}: the bundle's plan names no profile{named}; pass --profile")
        profile = plan.profile_path
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    if prof.model_sha256 != plan.model_sha256:
        raise InputError(
            f"{bundle}: the profile is for model {prof.model_sha256[:12]}, the bundle's plan for {plan.model_sha256[:12]}"
        )
    return plan, uncalibrated(prof)


def calibrate(
    bundle: str | os.PathLike,
    *,
    profile: Profile | str | os.PathLike | None = None,
    runs: int = 30,
    warmup: int = 5,
    max_rounds: int = 3,
    tolerance: float = 0.05,
    progress: Progress | None = None,
    trust_key: str | os.PathLike | None = None,
) -> Calibration:
    """Calibrate the profile of ``bundle``'s plan against its measured runs (see the module doc).

    Raises:
        InputError: no profile to calibrate, or one of another model.
        PlanError, BundleError: for a bundle or plan that cannot be loaded or priced.
    """
    plan, base = base_profile(bundle, profile, trust_key)
    start = plan_costs(plan, base)
    priced = start
    current = base
    label = f"{Path(bundle).name}: {plan.model_name} on {plan.device}"
    measured: Measured | None = None
    rounds: list[Round] = []
    converged = None
    for number in range(1, max_rounds + 1):
        fresh = measure(bundle, runs, warmup, trust_key=trust_key)
        predicted = priced.latency_ms()
        error = fresh.latency_ms / predicted - 1 if predicted > 0 else float("inf")
        measured = fresh if measured is None else measured.merged(fresh)
        if number > 1 and abs(error) <= tolerance and converged is None:
            converged = number - 1
        current, fits = fit_profile(start.cm, start.assign, start.names, base, measured, label, start.parts)
        rounds.append(Round(number, predicted, fresh.latency_ms, error, tuple(fits)))
        if progress is not None:
            progress(
                f"round {number}: predicted {predicted:.3f} ms, measured {fresh.latency_ms:.3f} ms ({error:+.1%})"
            )
        priced = plan_costs(plan, current)
        if converged is not None:
            break
    record = {
        "bundle": os.path.abspath(bundle),
        "rounds": [
            {
                "predicted_ms": round(r.predicted_ms, 6),
                "measured_ms": round(r.measured_ms, 6),
                "error": round(r.error, 6),
            }
            for r in rounds
        ],
        "converged_after": converged,
        "tolerance": tolerance,
        "runs_per_round": runs,
    }
    current = dataclasses.replace(current, calibration=record)
    return Calibration(current, tuple(rounds), converged, priced.latency_ms(), tolerance)
