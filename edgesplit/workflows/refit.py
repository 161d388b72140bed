"""``calibrate``: run bundles, refit their profile's cost terms from the measured part runs, repeat.

The loop closes the truth cycle (DESIGN.md): the first bundle's plan names the profile it was made
from (or ``profile`` is given); every bundle must be of the same model on the same device (for
example the plan and the baselines ``deploy`` verified it against). Each round runs every bundle
through the real :class:`Session`, in :data:`TURNS` turns per bundle that alternate between the
bundles in an order rotated every turn (ABC, BCA, CAB), so that a slow phase of the machine falls on
all of them alike rather than on one bundle's block (:func:`measure_alternating`), reduces their
timing records, and fits the terms
(:func:`edgesplit.optimize.refit.fit_profile`) on every bundle's runs so far together, always
starting from the profile as measured. A round first predicts its fresh runs with the terms fitted
before it: the loop has converged when every bundle's prediction is within ``tolerance`` of its
measurement. ``edgesplit refit`` writes the result; ``partition --profile`` then plans with it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

import numpy as np

from edgesplit.bundle.format import open_bundle
from edgesplit.device.spec import load_device, network_link
from edgesplit.errors import InputError, PlanError
from edgesplit.optimize.costs import CostModel, build_costs
from edgesplit.optimize.pipeline import period_ms
from edgesplit.optimize.plan import Plan
from edgesplit.optimize.refit import (
    Measured,
    Observed,
    PairFit,
    RemoteCall,
    Streamed,
    fit_profile,
    uncalibrated,
)
from edgesplit.optimize.schedule import schedule
from edgesplit.profile.predict import complete_profile
from edgesplit.profile.store import Profile, load_profile
from edgesplit.runtime.session import load
from edgesplit.runtime.trace import PartRun, Trace
from edgesplit.workflows.refit_rounds import RefitRounds
from edgesplit.workflows.resolve import load_graph, plan_device, with_server_profile

Progress = Callable[[str], None]
# A round's runs of each bundle come in this many turns, alternating between the bundles. One block
# per bundle lets a transient of one block fit into the profile as that processor's speed. (The case
# that prompted this, mobilenetv2 on host-2core's core1 calibrated to 12.9 ms against 9.4 measured,
# turned out to be the fit: see optimize.calibrate._anchored.)
TURNS = 3
MIN_GAPS = 3  # queued part runs a worker's stream gap is taken from (fewer: left as profiled)


@dataclass(frozen=True)
class Case:
    """One bundle in one round: its latency (``metric`` "latency") or its stream's period
    ("period"), predicted with the terms fitted before the round, and measured (``error`` is
    ``measured / predicted - 1``)."""

    bundle: str
    predicted_ms: float
    measured_ms: float
    metric: str = "latency"

    @property
    def error(self) -> float:
        return self.measured_ms / self.predicted_ms - 1 if self.predicted_ms > 0 else float("inf")


@dataclass(frozen=True)
class Round:
    """One round: every bundle's case, and the terms fitted after it."""

    number: int
    cases: tuple[Case, ...]
    fits: tuple[PairFit, ...] = ()


@dataclass(frozen=True)
class Refit:
    """The calibrated profile and how it came about.

    Attributes:
        converged_after: Fitting rounds until a round's fresh runs were predicted within the
            tolerance for every bundle (None: not within ``max_rounds``).
        predicted_ms: Each bundle's latency predicted with the final profile.
    """

    profile: Profile
    rounds: tuple[Round, ...]
    converged_after: int | None
    predicted_ms: dict[str, float]
    tolerance: float


def measure(
    bundle: str | os.PathLike,
    runs: int = 30,
    warmup: int = 5,
    *,
    trust_key: str | os.PathLike | None = None,
    server_url: str | None = None,
) -> Measured:
    """Run ``bundle`` ``runs`` times (after ``warmup``) and reduce its records for the fit
    (``trust_key``: the bundle must be signed by it, as for
    :func:`~edgesplit.runtime.session.load`):
    :func:`measure_alternating` with one bundle in one turn."""
    return measure_alternating(
        [bundle], runs, warmup, turns=1, trust_key=trust_key, server_url=server_url
    )[str(bundle)]


def _options(server_url: str | None) -> dict | None:
    return {"remote": {"url": server_url}} if server_url else None


def remote_calls(bundle: str, stats: dict) -> dict[str, RemoteCall]:
    """Per server part, its calls as :class:`RemoteCall` (from ``Session.remote_stats()``).

    Raises:
        InputError: a part that ran on its local fallback (the server failed it or could not be
            reached), or a server that does not say how long the part computed.
    """
    out = {}
    for name, st in stats.items():
        if st.local_runs or st.failures or not st.remote_runs:
            why = st.last_error or "it was not called"
            raise InputError(
                f"{bundle}: part {name} ran on its local fallback, not on {st.url} ({why})"
            )
        compute = st.compute_ms_median if st.compute_ms_median is not None else st.server_ms_median
        if compute is None or st.remote_ms_median is None:
            raise InputError(
                f"{bundle}: the server {st.url} does not say how long part {name} computed "
                "(no Server-Timing), so its calls cannot be told from its compute"
            )
        n = st.remote_runs
        out[name] = RemoteCall(
            st.remote_ms_median, compute, st.sent_nbytes / n, st.received_nbytes / n, n
        )
    return out


def measure_alternating(
    bundles: Sequence[str | os.PathLike],
    runs: int = 30,
    warmup: int = 5,
    *,
    turns: int = TURNS,
    trust_key: str | os.PathLike | None = None,
    server_url: str | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Measured]:
    """Per bundle (by ``str`` of its path): its ``runs`` reduced for the fit, as :func:`measure`
    does, run in ``turns`` turns that alternate between the bundles, all loaded at once and warmed
    up first. Each turn starts with one untimed request, which lets the previous bundle's runtime
    threads go quiet (as deploy's verification does); its records are not kept. With
    ``server_url``, server parts are called there, and each bundle's calls are kept
    (:func:`remote_calls`). ``inputs``: values of inputs to run with (the others are made up).
    """
    from edgesplit.runtime.harness import random_feeds

    names = [str(b) for b in bundles]
    per_turn = [runs // turns + (i < runs % turns) for i in range(turns)]
    got: dict[str, Measured] = {}
    with ExitStack() as stack:
        opts = _options(server_url)
        sessions = {
            b: stack.enter_context(load(b, trust_key=trust_key, executor_options=opts))
            for b in names
        }
        feeds = {b: random_feeds(s, given=inputs) for b, s in sessions.items()}
        for b, sess in sessions.items():
            for _ in range(warmup):
                sess.run(feeds[b])
        for turn, k in enumerate(per_turn):
            if k == 0:
                continue
            shift = turn % len(names)
            for b in names[shift:] + names[:shift]:
                sess = sessions[b]
                sess.run(feeds[b])
                sess.reset_stats()
                wall = []
                for _ in range(k):
                    t0 = time.perf_counter()
                    sess.run(feeds[b])
                    wall.append((time.perf_counter() - t0) * 1e3)
                m = reduce_trace(sess.trace_records(), wall)
                if server_url:
                    m = dataclasses.replace(m, remote=remote_calls(b, sess.remote_stats()))
                got[b] = m if b not in got else got[b].merged(m)
    return got


def measure_stream(
    bundle: str | os.PathLike,
    requests: int = 30,
    *,
    trust_key: str | os.PathLike | None = None,
    server_url: str | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
) -> Streamed | None:
    """Run ``bundle`` as a pipelined stream of ``requests`` after it filled (and a stream to warm
    up): its period and each part's run in it. None for a plan on fewer than two local processors
    (nothing overlaps)."""
    from edgesplit.runtime.harness import random_feeds, stream_period_ms

    with load(bundle, trust_key=trust_key, executor_options=_options(server_url)) as sess:
        parts = sess.manifest.parts
        if len({p.processor for p in parts if not p.remote}) < 2:
            return None
        fill = sess.stream_window
        feeds = random_feeds(sess, given=inputs)
        for _ in sess.run_stream(feeds for _ in range(2 * fill)):
            pass
        sess.reset_stats()
        period = stream_period_ms(sess, feeds, requests)
        trace = sess.trace_records()
    first = min(r.request for r in trace.parts) + fill  # the timed requests: filled, not draining
    timed = [r for r in trace.parts if first <= r.request < first + requests]
    spans: dict[str, list[float]] = {}
    for r in timed:
        spans.setdefault(r.part, []).append(r.span_ns / 1e6)
    medians = {k: float(np.median(v)) for k, v in spans.items()}
    return Streamed(period, medians, requests, queued_gaps_ms(timed))


def queued_gaps_ms(runs: Sequence[PartRun]) -> dict[str, float]:
    """Per local processor: the median time from a part run's outputs collected to the start of the
    next run on the same worker, over the runs that were queued before the one ahead ended."""
    by_lane: dict[str, list] = {}
    for r in runs:
        if not r.lane.startswith("remote:"):
            by_lane.setdefault(r.lane, []).append(r)
    out = {}
    for rs in by_lane.values():
        rs.sort(key=lambda r: r.start_ns)
        gaps = [
            (b.start_ns - a.collected_ns) / 1e6
            for a, b in zip(rs, rs[1:])
            if b.submit_ns <= a.collected_ns
        ]
        if len(gaps) >= MIN_GAPS:
            out[rs[0].processor] = float(np.median(gaps))
    return out


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

    def period_ms(self) -> float:
        """A pipelined stream's period (the optimiser's model: its own parts for the assignment)."""
        return period_ms(self.cm, self.assign)


def plan_costs(plan: Plan, profile: Profile) -> PlanCosts:
    """The plan's problem under ``profile``, each node on the processor and backend the plan gave
    it.

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
            plan.server_path
            if plan.server_path and Path(plan.server_path).is_file()
            else plan.server
        )
    link = network_link(plan.link) if plan.link else None  # older plans name the preset
    if server is not None and plan.server_profile_path:  # the server priced as the plan priced it
        profile = with_server_profile(graph, profile, server, plan.server_profile_path)
    cm = build_costs(
        graph,
        complete_profile(graph, full, profile),
        full,
        server=server,
        link=link,
        assignment=plan.assignment,
    )
    assign = np.array(
        [cm.proc_index(plan.assignment[n]["processor"]) for n in cm.nodes], dtype=np.int64
    )
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
            f"{bundle}: the profile is for model {prof.model_sha256[:12]}, the bundle's plan for "
            f"{plan.model_sha256[:12]}"
        )
    return plan, uncalibrated(prof)


def _plans(
    bundles: Sequence[str | os.PathLike], profile, trust_key, server_url: str | None = None
) -> tuple[dict[str, Plan], Profile]:
    """Each bundle's plan (by its path as given) and the profile to calibrate.

    Raises:
        InputError: no bundle, the same bundle twice, bundles of different models or devices, or
            a bundle with parts on a server and no ``server_url``.
    """
    if not bundles:
        raise InputError("calibrate: no bundle given")
    first, base = base_profile(bundles[0], profile, trust_key)
    if not server_url:
        _local_only(bundles[0], first)
    plans = {str(bundles[0]): first}
    for b in bundles[1:]:
        if str(b) in plans:
            raise InputError(f"{b}: given twice")
        plan = open_bundle(b, trust_key=trust_key).plan
        if (plan.model_sha256, plan.device) != (first.model_sha256, first.device):
            raise InputError(
                f"{b}: its plan is for model {plan.model_sha256[:12]} on {plan.device}, the first "
                f"bundle's ({bundles[0]}) for {first.model_sha256[:12]} on {first.device}"
            )
        if not server_url:
            _local_only(b, plan)
        plans[str(b)] = plan
    return plans, base


def _local_only(bundle: str | os.PathLike, plan: Plan) -> None:
    """Refuse a plan with server parts when no server is given: they would run on their local
    fallback, and be measured as that."""
    remote = [f"{p.name} ({p.processor})" for p in plan.parts if p.remote]
    if remote:
        raise InputError(
            f"{bundle}: parts {', '.join(remote)} run on the server, and no server was given (they "
            "would "
            "run on their local fallback here): pass --server URL, a server that serves them"
        )


def _cases(bundle: str, priced: PlanCosts, fresh: Measured) -> list[Case]:
    """The bundle's latency case, and its period case when it was streamed."""
    pairs = [("latency", priced.latency_ms(), fresh.latency_ms)]
    if fresh.stream is not None:
        pairs.append(("period", priced.period_ms(), fresh.stream.period_ms))
    return [Case(bundle, pred, got, metric) for metric, pred, got in pairs]


class RefitOptions(TypedDict, total=False):
    """How :func:`refit` measures and when it stops (every key optional)."""

    runs: int
    """Measured runs per bundle and round (default 30)."""
    warmup: int
    """Runs first, not measured (default 5)."""
    max_rounds: int
    """Rounds at most (default 3)."""
    tolerance: float
    """Converged when every prediction is within this share of its measurement (default 0.05)."""
    progress: Progress | None
    trust_key: str | os.PathLike | None
    """The public key signed bundles must be signed with."""
    server_url: str | None
    """A server that serves the bundles' server parts (``edgesplit serve``); their calls there fit
    the cost of a call (:func:`~edgesplit.optimize.refit.fit_remote_call`)."""
    inputs: Mapping[str, np.ndarray] | None
    """Values of inputs to run the bundles with (``--input``); the others are made up."""


def refit(
    bundles: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    profile: Profile | str | os.PathLike | None = None,
    **options: Unpack[RefitOptions],
) -> Refit:
    """Refit the profile of the bundles' plans to their measured runs (see the module doc).

    ``options``: :class:`RefitOptions`.

    Raises:
        InputError: no profile to calibrate, one of another model, bundles that differ in model
            or device, server parts without ``server_url``, or a server that failed them.
        PlanError, BundleError: for a bundle or plan that cannot be loaded or priced.
    """
    d = RefitRounds()
    runs, warmup = options.get("runs", d.runs), options.get("warmup", d.warmup)
    max_rounds = options.get("max_rounds", d.max_rounds)
    tolerance = options.get("tolerance", d.tolerance)
    progress, trust_key = options.get("progress"), options.get("trust_key")
    server_url, inputs = options.get("server_url"), options.get("inputs")
    paths = [bundles] if isinstance(bundles, (str, os.PathLike)) else list(bundles)
    plans, base = _plans(paths, profile, trust_key, server_url)
    start = {b: plan_costs(plan, base) for b, plan in plans.items()}
    priced = dict(start)
    first = next(iter(plans.values()))
    label = f"{', '.join(Path(b).name for b in plans)}: {first.model_name} on {first.device}"
    measured: dict[str, Measured] = {}
    rounds: list[Round] = []
    converged = None
    current = base
    for number in range(1, max_rounds + 1):
        order = list(plans)[(number - 1) % len(plans) :] + list(plans)[: (number - 1) % len(plans)]
        cases = []
        single = measure_alternating(
            order, runs, warmup, trust_key=trust_key, server_url=server_url, inputs=inputs
        )
        for b in order:
            stream = measure_stream(
                b, runs, trust_key=trust_key, server_url=server_url, inputs=inputs
            )
            fresh = dataclasses.replace(single[b], stream=stream)
            cases += _cases(b, priced[b], fresh)
            measured[b] = fresh if b not in measured else measured[b].merged(fresh)
        cases.sort(key=lambda c: (list(plans).index(c.bundle), c.metric))
        if number > 1 and all(abs(c.error) <= tolerance for c in cases) and converged is None:
            converged = number - 1
        observed = [
            Observed(start[b].cm, start[b].assign, start[b].names, measured[b], start[b].parts)
            for b in plans
        ]
        current, fits = fit_profile(observed, base, label)
        rounds.append(Round(number, tuple(cases), tuple(fits)))
        if progress is not None:
            for c in cases:
                progress(
                    f"round {number}: {c.bundle} {c.metric}: predicted {c.predicted_ms:.3f} ms, "
                    f"measured {c.measured_ms:.3f} ms ({c.error:+.1%})"
                )
        priced = {b: plan_costs(plan, current) for b, plan in plans.items()}
        if converged is not None:
            break
    record = _record(list(plans), rounds, converged, tolerance, runs)
    if server_url:
        record["server_url"] = server_url  # where the calls that fitted the call's cost went
    current = dataclasses.replace(current, calibration=record)
    return Refit(
        current, tuple(rounds), converged, {b: p.latency_ms() for b, p in priced.items()}, tolerance
    )


def _record(
    bundles: list[str], rounds: list[Round], converged: int | None, tolerance: float, runs: int
) -> dict:
    """What the calibrated profile records of how it came about."""
    return {
        "bundles": [os.path.abspath(b) for b in bundles],
        "rounds": [
            {
                "cases": [
                    {
                        "bundle": os.path.abspath(c.bundle),
                        "metric": c.metric,
                        "predicted_ms": round(c.predicted_ms, 6),
                        "measured_ms": round(c.measured_ms, 6),
                        "error": round(c.error, 6),
                    }
                    for c in r.cases
                ]
            }
            for r in rounds
        ],
        "converged_after": converged,
        "tolerance": tolerance,
        "runs_per_round": runs,
    }
