"""The verdict of a verification, as the bundle's manifest records it (``Manifest.verification``).

``deploy`` (and ``compile --verify``) measures the compiled plan against the best baselines on the
target (:mod:`edgesplit.workflows.verify`) and ships the measured winner; these dataclasses are what
it
found: every candidate with its figures (or why it could not be built or run), which one was
shipped and why. They are plain data, so a bundle reader needs nothing from the runtime.

Figures are per request, in ms: the single-request median for the ``latency`` metric, the stream's
period (1000 / requests per second) for ``throughput``. For ``energy`` the figures are the measured
latency, and ``energy_mj`` is *modelled* from it (no power rails here): the candidate's predicted
energy scaled by its measured over its predicted latency.

A candidate with int8 or fp16 parts also has its accuracy against fp32, measured by running its
bundle on the held-out calibration samples; one that misses the accuracy budget is never shipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from edgesplit.util import known_fields


@dataclass(frozen=True)
class MeasuredCandidate:
    """One candidate of a verification: the plan, or a baseline.

    Attributes:
        name: ``plan``, ``only:<processor>`` (the whole model as one part with the processor's
            first backend), ``only:<processor>/<backend>``, ``best-single-cut``, ``server-only``.
        summary: What it assigns where.
        n_parts: Parts of its bundle.
        predicted_ms: The cost model's figure for the metric (makespan, or period for throughput).
        measured_ms: Median of the metric over every round (None when not measured).
        spread_pct: Spread of the per-round medians, ``(max - min) / median`` in percent.
        ratio_to_best: The metric over the best measured candidate's (energy for ``energy``).
        energy_mj: Modelled energy per request from the measured latency (``energy`` and
            ``latency`` metrics).
        rounds_ms: The per-round medians, in the order of the rounds.
        same_as: The candidate whose bundle this one is identical to (measured once, under that
        name).
        error: Why it could not be built or run (then it has no figures).
        snr_db, top1_agreement: Its outputs against fp32 on the held-out calibration samples (None
            when every part is fp32: exact, not run).
        meets_budget: Whether that meets the accuracy budget (None: all fp32, which meets any).
        accuracy_misses: Why it misses the budget (empty when it meets it).
    """

    name: str
    summary: str
    n_parts: int = 0
    predicted_ms: float | None = None
    measured_ms: float | None = None
    spread_pct: float | None = None
    ratio_to_best: float | None = None
    energy_mj: float | None = None
    rounds_ms: tuple[float, ...] = ()
    same_as: str | None = None
    error: str | None = None
    snr_db: float | None = None
    top1_agreement: float | None = None
    meets_budget: bool | None = None
    accuracy_misses: str = ""

    @property
    def measured(self) -> bool:
        return self.measured_ms is not None

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> MeasuredCandidate:
        kw = known_fields(MeasuredCandidate, d)
        kw["rounds_ms"] = tuple(float(x) for x in d.get("rounds_ms", ()))
        return MeasuredCandidate(**kw)


@dataclass(frozen=True)
class Verification:
    """What measuring the plan against the baselines on the target found, and what was shipped.

    Attributes:
        metric: ``latency``, ``throughput`` or ``energy`` (from the plan's objective).
        shipped: The name of the candidate whose bundle was shipped.
        kept_plan: True when the optimiser's plan was shipped (verified, or unverifiable and kept).
        reason: One sentence: why that candidate was shipped.
        candidates: Every candidate, the plan first, including those that could not be built or run.
        rounds: Completed rounds (each candidate once per round, in rotating order). Fewer than
            the minimum (3) when the budget allowed no more: the plan is then not kept over a
            measured baseline.
        requests_per_turn: Timed requests per candidate per round (after one untimed).
        budget_s: The measurement budget; ``measure_s`` is what measuring took (warm-up and
            rounds); ``load_s`` (loading the bundles into Sessions) and ``compile_s`` (building the
            candidates' bundles) come on top.
        plan_ratio_low, plan_ratio_high: The lowest and highest per-round ratio of the plan to the
            best other candidate (paired by round, so drift cancels); the plan is kept only when
            the highest is below 1.
        notes: What was skipped or modelled, and why.
        accuracy_budget: The budget candidates with int8/fp16 parts were held to (its summary).
        accuracy_s: Measuring their accuracy took this long (on top of the budget).
    """

    metric: str
    shipped: str
    kept_plan: bool
    reason: str
    candidates: tuple[MeasuredCandidate, ...] = ()
    rounds: int = 0
    requests_per_turn: int = 0
    budget_s: float = 0.0
    measure_s: float = 0.0
    compile_s: float = 0.0
    load_s: float = 0.0
    plan_ratio_low: float | None = None
    plan_ratio_high: float | None = None
    notes: tuple[str, ...] = ()
    accuracy_budget: str = ""
    accuracy_s: float = 0.0

    def candidate(self, name: str) -> MeasuredCandidate:
        """The candidate called ``name`` (KeyError if none)."""
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Verification:
        """Read a verdict; keys a newer writer added are left, missing ones take their defaults."""
        kw = known_fields(Verification, d)
        kw["candidates"] = tuple(MeasuredCandidate.from_json(c) for c in d.get("candidates", ()))
        kw["notes"] = tuple(d.get("notes", ()))
        return Verification(**kw)
