"""From measured rounds to a verdict: the figures of every candidate, and which one to ship.

The rule. Let B be the best measured candidate other than the plan (by median; a baseline whose
bundle *is* the plan's counts as the plan). The plan is kept only when it is faster than B in every
round, pairing the two by round so that drift of the machine cancels: the highest per-round ratio
plan / B is the measured noise's upper end, and it must be below 1. Otherwise B is shipped: a
baseline is simpler (fewer parts) and measured at least as fast within the noise; but at a latency
tie (the plan's median per-round ratio at most 1.02) the plan is kept where its modelled energy is
at least 10% lower (see :func:`_cheaper_at_a_tie`). With too little time for the minimum rounds,
or nothing to compare with, the plan is kept and the verdict says so.

Accuracy comes first: a candidate with int8 or fp16 parts whose measured accuracy misses the budget
(:mod:`edgesplit.workflows.verify.accuracy`) is never shipped, however fast. When the plan misses
it, the
best measured candidate that meets it is shipped (all-fp32 candidates always do), and the reason
says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgesplit.bundle.verdict import MeasuredCandidate
from edgesplit.errors import PlanError
from edgesplit.optimize.plan import Plan
from edgesplit.workflows.verify.candidates import PLAN, Candidate
from edgesplit.workflows.verify.measure import Measurement

if TYPE_CHECKING:
    from edgesplit.workflows.verify.accuracy import Measured

# What a plan made for an objective is measured on; objectives not named here: latency. Energy is
# modelled from measured latency where there are no power rails (see edgesplit.bundle.verdict).
METRIC_OF_OBJECTIVE = {"throughput": "throughput", "energy": "energy"}


def metric_for(objective: str) -> str:
    """``latency``, ``throughput`` or ``energy``: what a plan for ``objective`` is verified on."""
    return METRIC_OF_OBJECTIVE.get(objective, "latency")


def _predicted_ms(plan: Plan | None, metric: str) -> float | None:
    if plan is None:
        return None
    return plan.predicted.period_ms if metric == "throughput" else plan.predicted.latency_ms


def _mj_per_ms(plan: Plan) -> float | None:
    """Predicted device energy per ms of predicted latency (energy is modelled from latency)."""
    lat, mj = plan.predicted.latency_ms, plan.predicted.energy_mj
    return mj / lat if lat and mj is not None else None


def _accuracy_fields(found: Measured | None) -> dict:
    if found is None:
        return {}
    a = found.accuracy
    return {
        "snr_db": round(a.snr_db, 3),
        "top1_agreement": a.top1_agreement,
        "meets_budget": not found.misses,
        "accuracy_misses": "; ".join(found.misses),
    }


def _row(
    c: Candidate, meas: Measurement, metric: str, accuracy: Mapping[str, Measured]
) -> MeasuredCandidate:
    twin = c.same_as or c.name
    base = MeasuredCandidate(
        c.name,
        c.summary,
        len(c.plan.parts) if c.plan else 0,
        _predicted_ms(c.plan, metric),
        same_as=c.same_as,
        error=c.error,
        **_accuracy_fields(accuracy.get(twin)),
    )
    if c.error is not None or c.plan is None:
        return base
    if twin in meas.errors:
        return MeasuredCandidate(**{**base.__dict__, "error": meas.errors[twin]})
    rounds = meas.rounds_ms.get(twin)
    if not rounds:
        return base
    med = float(np.median(rounds))
    energy = None
    if metric in ("energy", "latency") and _mj_per_ms(c.plan) is not None:
        energy = round(_mj_per_ms(c.plan) * med, 6)
    return MeasuredCandidate(
        **{
            **base.__dict__,
            "measured_ms": round(med, 6),
            "spread_pct": round((max(rounds) - min(rounds)) / med * 100, 3) if med > 0 else 0.0,
            "energy_mj": energy,
            "rounds_ms": tuple(round(x, 6) for x in rounds),
        }
    )


def _value(row: MeasuredCandidate, metric: str) -> float:
    v = row.energy_mj if metric == "energy" else row.measured_ms
    return float("inf") if v is None else v


def rows(
    cands: Sequence[Candidate],
    meas: Measurement,
    metric: str,
    accuracy: Mapping[str, Measured] | None = None,
) -> list[MeasuredCandidate]:
    """Every candidate's figures (accuracy from ``accuracy``, by name), with its ratio to the best
    measured one."""
    out = [_row(c, meas, metric, accuracy or {}) for c in cands]
    best = min((_value(r, metric) for r in out), default=float("inf"))
    if not np.isfinite(best) or best <= 0:
        return out
    return [
        MeasuredCandidate(**{**r.__dict__, "ratio_to_best": round(_value(r, metric) / best, 4)})
        if r.measured
        else r
        for r in out
    ]


def _per_round(row: MeasuredCandidate, metric: str) -> np.ndarray:
    x = np.asarray(row.rounds_ms, dtype=float)
    if metric == "energy" and row.energy_mj is not None and row.measured_ms:
        x = x * (row.energy_mj / row.measured_ms)
    return x


def _instead_of_inaccurate(
    table: Sequence[MeasuredCandidate], metric: str
) -> tuple[str, str, float | None, float | None]:
    """The plan misses the accuracy budget: the best measured candidate that meets it (or, with no
    timing, the first that was built).

    Raises:
        PlanError: when no candidate meets the budget (nothing is shipped).
    """
    plan = table[0]
    ok = [
        r
        for r in table[1:]
        if r.error is None and r.same_as != PLAN and r.meets_budget is not False
    ]
    timed = [r for r in ok if r.measured]
    why = f"the plan misses the accuracy budget ({plan.accuracy_misses}, SNR {plan.snr_db:.1f} dB)"
    if timed:
        best = min(timed, key=lambda r: _value(r, metric))
        return (
            best.name,
            f"{why}; {best.name} is the best measured candidate that meets it",
            None,
            None,
        )
    if ok:
        return ok[0].name, f"{why}; {ok[0].name} meets it (not timed)", None, None
    raise PlanError(f"{why}, and no other candidate that meets it could be built: nothing to ship")


def decide(
    table: Sequence[MeasuredCandidate], metric: str, short: str | None, min_rounds: int = 3
) -> tuple[str, str, float | None, float | None]:
    """(shipped candidate, reason, lowest and highest per-round ratio of the plan to the best
    other).

    With fewer than ``min_rounds`` rounds (a budget too small for more), the plan is not kept on
    that evidence: the best measured baseline is shipped, which never loses to a baseline."""
    plan = table[0]
    assert plan.name == PLAN
    if plan.meets_budget is False:
        return _instead_of_inaccurate(table, metric)
    if short is not None:
        return PLAN, f"{short}: kept the plan unverified", None, None
    others = [r for r in table[1:] if r.measured and r.meets_budget is not False]
    if not others:
        what = (
            "the plan could not be measured"
            if not plan.measured
            else "no baseline could be measured"
        )
        return PLAN, f"{what}: kept the plan unverified", None, None
    best = min(others, key=lambda r: _value(r, metric))
    if best.same_as == PLAN:
        return PLAN, f"the plan is {best.name}, the best measured candidate", None, None
    if not plan.measured:
        return (
            best.name,
            f"the plan could not run ({plan.error}); {best.name} is the best measured candidate",
            None,
            None,
        )
    a, b = _per_round(plan, metric), _per_round(best, metric)
    n = min(len(a), len(b))  # a raced candidate that stopped early has fewer rounds
    q = a[:n] / b[:n]
    low, high = round(float(q.min()), 4), round(float(q.max()), 4)
    span = (
        f"plan / {best.name}: median {float(np.median(q)):.2f}, {low:.2f}-{high:.2f} over "
        f"{len(q)} rounds"
    )
    better, worse = ("cheaper", "costlier") if metric == "energy" else ("faster", "slower")
    if high < 1.0 and len(q) < min_rounds:
        few = (
            f"the plan was {better} than {best.name} in {len(q)} round(s), fewer than the "
            f"{min_rounds} needed"
        )
        return best.name, f"{few} to keep it ({span})", low, high
    if high < 1.0:
        return (
            PLAN,
            f"the plan is {better} than {best.name}, the best baseline, in every round ({span})",
            low,
            high,
        )
    if low >= 1.0:
        verdict = f"the plan is {worse} than {best.name} in every round ({span})"
        return best.name, verdict, low, high
    if (cheaper := _cheaper_at_a_tie(plan, best, q, metric)) is not None:
        return (
            PLAN,
            f"the plan is level with {best.name} within the noise ({span}) and {cheaper}",
            low,
            high,
        )
    verdict = f"the plan is not {better} than {best.name} beyond the noise ({span})"
    return best.name, verdict, low, high


# A latency tie (neither faster in every round, the plan's median per-round ratio at most this) is
# settled by modelled energy when the plan's is at least ENERGY_MARGIN lower.
TIE_RATIO = 1.02
ENERGY_MARGIN = 0.10


def _cheaper_at_a_tie(
    plan: MeasuredCandidate, best: MeasuredCandidate, q: np.ndarray, metric: str
) -> str | None:
    """Why the plan is shipped at a latency tie with ``best`` (``q``: plan / best per round), or
    None. Level within the noise, the candidate that spends less energy wins: on unequal cores
    that is the big cores alone against plain ORT's threads over big and little ones, which a
    20 s verification measured level (alexnet and PP-OCRv4 det on ``host-biglittle``, median
    per-round ratio 1.00, range 0.76-1.20) where 120 single requests each put the big core 6-10%
    ahead; and the little core left idle is free for the rest of the phone."""
    if metric != "latency" or float(np.median(q)) > TIE_RATIO:
        return None
    mine, theirs = plan.energy_mj, best.energy_mj
    if mine is None or theirs is None or mine > (1.0 - ENERGY_MARGIN) * theirs:
        return None
    lower = 1.0 - mine / theirs
    return f"its modelled energy is {lower:.0%} lower ({mine:.3g} against {theirs:.3g} mJ)"
