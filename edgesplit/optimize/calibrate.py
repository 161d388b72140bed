"""Refit a profile's cost terms from a bundle's measured part runs: the pure half of ``calibrate``.

The runtime half (:mod:`edgesplit.calibrate`) runs the bundle and reduces its timing records to a
:class:`Measured`; :func:`fit_profile` then fits a few terms, not the parts themselves, so that
other plans of the same model and device gain too:

* per (processor, backend) pair that ran parts: a scale on node costs (``node_scale``), the fixed
  cost of a part run (``part_fixed_ms``) and a cost per tensor entering a part (``crossing_ms``),
  by least squares of the measured part runs (start to done, on the worker) against the modelled
  ones, net of the terms kept (bytes, reorders, contention), with a prior that holds each term to
  its measured value where the parts cannot tell them apart (few parts, similar sizes);
* per processor: the hand-off curve, where the runs gave at least :data:`MIN_SAMPLES` hand-offs
  near a gap of the curve;
* per request: the Session's own work, from the wall-clock latency of ``Session.run`` against the
  span its records cover, less the modelled caller wake-up.

It always starts from the profile as measured (a calibrated profile's terms are reset first), so
further rounds only add measurements: they converge rather than compound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.schedule import layout, schedule
from edgesplit.profile.store import ProcessorProfile, Profile, RunTerms

MIN_SAMPLES = 3
# The prior's spread: how far a fitted term may move from its measured value before the data must
# pay for it (in the units of the term), against each part's own spread (its p90 - median, at
# least SPREAD_FLOOR of its median, and at least SPREAD_MIN_MS).
PRIOR_FIXED_MS = 0.05
PRIOR_SCALE = 0.5
PRIOR_CROSSING_MS = 0.1
SPREAD_FLOOR = 0.02
SPREAD_MIN_MS = 0.01


@dataclass(frozen=True)
class Measured:
    """A bundle's runs reduced for the fit (medians unless said otherwise).

    Attributes:
        part_ms: Per part of the plan (by name): its run on the worker, start to done.
        part_p90_ms: The same, 90th percentile (the spread weighs each part in the fit).
        handoffs: ``(processor, idle gap ms, hand-off ms)`` of every run that found its worker idle.
        latency_ms: ``Session.run`` as its caller timed it.
        span_ms: The same requests as the Session's records cover them (first part ready to last
            part done): the difference is the Session's own work and the caller's wake-up.
        requests: How many requests the medians are over.
    """

    part_ms: Mapping[str, float]
    handoffs: tuple[tuple[str, float, float], ...]
    latency_ms: float
    span_ms: float
    requests: int
    part_p90_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def merged(self, other: Measured) -> Measured:
        """Both runs' figures together (medians weighted by their requests)."""
        n, m = self.requests, other.requests
        w = n / (n + m) if n + m else 0.5
        mix = lambda a, b: w * a + (1 - w) * b  # noqa: E731
        return Measured(
            {k: mix(v, other.part_ms.get(k, v)) for k, v in self.part_ms.items()},
            self.handoffs + other.handoffs,
            mix(self.latency_ms, other.latency_ms),
            mix(self.span_ms, other.span_ms),
            n + m,
            {k: mix(v, other.part_p90_ms.get(k, v)) for k, v in self.part_p90_ms.items()},
        )


@dataclass(frozen=True)
class PairFit:
    """One pair's fitted terms and the parts they were fitted on."""

    processor: str
    backend: str
    node_scale: float
    part_fixed_ms: float
    crossing_ms: float
    parts: int


def uncalibrated(profile: Profile) -> Profile:
    """``profile`` with every fitted term back at its measured value."""
    entries = []
    for e in profile.entries:
        t = e.terms
        if t is not None and t.calibrated:
            measured = t.calibrated_from or {}
            t = dataclasses.replace(
                t,
                node_scale=1.0,
                crossing_ms=0.0,
                part_fixed_ms=measured.get("part_fixed_ms", t.part_fixed_ms),
                session_ms=measured.get("session_ms", t.session_ms),
                handoff_ms=tuple(measured.get("handoff_ms", t.handoff_ms)),
                calibrated="",
                calibrated_from={},
            )
        entries.append(dataclasses.replace(e, terms=t))
    return dataclasses.replace(profile, entries=tuple(entries), calibration={})


def _ridge(rows: np.ndarray, y: np.ndarray, prior: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """Least squares of ``rows @ b ~ y`` with ``b ~ prior`` (standard deviation ``spread``)."""
    a = np.vstack([rows, np.diag(1.0 / spread)])
    rhs = np.concatenate([y, prior / spread])
    return np.linalg.lstsq(a, rhs, rcond=None)[0]


def _entering(cm: CostModel, parts: Sequence[Sequence[int]]) -> np.ndarray:
    """Per part, the tensors it reads from other parts."""
    part_of = np.zeros(cm.n_nodes, dtype=np.int64)
    for k, p in enumerate(parts):
        part_of[list(p)] = k
    out = np.zeros(len(parts))
    for f in cm.flows:
        if f.src < 0:
            continue
        out[list({int(part_of[d]) for d in f.dsts} - {int(part_of[f.src])})] += 1
    return out


def _spread(measured: Measured, name: str) -> float:
    """A part's measured spread, the noise its row in the fit is weighed by."""
    med = measured.part_ms[name]
    p90 = measured.part_p90_ms.get(name, med)
    return max(p90 - med, SPREAD_FLOOR * med, SPREAD_MIN_MS)


def fit_pairs(
    cm: CostModel,
    assign: np.ndarray,
    part_names: Sequence[str],
    measured: Measured,
    parts: Sequence[Sequence[int]] | None = None,
) -> list[PairFit]:
    """Per pair that ran parts: node scale, fixed cost and crossing cost (see the module doc).

    ``parts`` are the plan's parts (node indices; default: the optimiser's for ``assign``) and
    ``part_names`` their names, in the same order.
    """
    lay = layout(cm, assign, parts)
    sched = schedule(cm, assign, parts)
    entering = _entering(cm, lay.parts)
    ov = cm.ov
    groups: dict[tuple[int, str], list[int]] = {}
    for k, part in enumerate(lay.parts):
        if part_names[k] in measured.part_ms:
            groups.setdefault((int(lay.proc[k]), cm.backend[part[0]][lay.proc[k]] or ""), []).append(k)
    fits = []
    for (p, backend), ks in groups.items():
        pc = ov.cost(p, backend)
        rows, y = [], []
        for k in ks:
            kept = float(sched.part_ms[k]) - lay.nodes_ms[k] - pc.part_ms - pc.crossing_ms * entering[k]
            rows.append([1.0, lay.nodes_ms[k], entering[k]])
            y.append(measured.part_ms[part_names[k]] - kept)
        prior = np.array([pc.part_ms, 1.0, pc.crossing_ms])
        spread = np.array([max(PRIOR_FIXED_MS, pc.part_ms), PRIOR_SCALE, PRIOR_CROSSING_MS])
        sigma = np.array([_spread(measured, part_names[k]) for k in ks])
        b = _ridge(np.array(rows) / sigma[:, None], np.array(y) / sigma, prior, spread)
        fits.append(
            PairFit(
                cm.processors[p],
                backend,
                float(max(b[1], 0.05)),
                float(max(b[0], 0.0)),
                float(max(b[2], 0.0)),
                len(ks),
            )
        )
    return fits


def fit_handoffs(
    gaps_ms: Sequence[float], curve_ms: Sequence[float], samples: Sequence[tuple[float, float]]
) -> tuple[float, ...]:
    """The hand-off curve with each gap's value replaced by the median of the measured hand-offs
    nearest that gap, where there are at least :data:`MIN_SAMPLES`."""
    if not gaps_ms:
        return tuple(curve_ms)
    grid = np.asarray(gaps_ms, dtype=float)
    near: dict[int, list[float]] = {}
    for gap, h in samples:
        near.setdefault(int(np.argmin(np.abs(grid - gap))), []).append(h)
    return tuple(
        round(float(np.median(near[i])), 6) if len(near.get(i, ())) >= MIN_SAMPLES else float(v)
        for i, v in enumerate(curve_ms)
    )


def _with_terms(e: ProcessorProfile, **changes) -> ProcessorProfile:
    t = e.terms if e.terms is not None else RunTerms(part_fixed_ms=e.dispatch_ms or 0.0)
    if not t.calibrated:
        keep = {
            "part_fixed_ms": t.part_fixed_ms,
            "session_ms": t.session_ms,
            "handoff_ms": list(t.handoff_ms),
        }
        changes.setdefault("calibrated_from", keep)
    return dataclasses.replace(e, terms=dataclasses.replace(t, **changes))


def fit_profile(
    cm: CostModel,
    assign: np.ndarray,
    part_names: Sequence[str],
    profile: Profile,
    measured: Measured,
    label: str,
    parts: Sequence[Sequence[int]] | None = None,
) -> tuple[Profile, list[PairFit]]:
    """``profile`` (the one ``cm`` was built from, uncalibrated) with terms fitted to ``measured``
    (``parts`` and ``part_names`` as for :func:`fit_pairs`)."""
    fits = {(f.processor, f.backend): f for f in fit_pairs(cm, assign, part_names, measured, parts)}
    by_proc: dict[str, list[tuple[float, float]]] = {}
    for proc, gap, h in measured.handoffs:
        by_proc.setdefault(proc, []).append((gap, h))
    home = cm.processors[cm.home]
    wake = cm.ov.wake(measured.span_ms)
    session = max(measured.latency_ms - measured.span_ms - wake, 0.0)
    entries = []
    for e in profile.entries:
        changes: dict = {}
        f = fits.get((e.processor, e.backend))
        if f is not None:
            old = e.terms.node_scale if e.terms is not None else 1.0
            changes.update(node_scale=round(old * f.node_scale, 6), part_fixed_ms=round(f.part_fixed_ms, 6))
            changes.update(crossing_ms=round(f.crossing_ms, 6))
        if e.terms is not None and by_proc.get(e.processor):
            changes["handoff_ms"] = fit_handoffs(
                e.terms.handoff_idle_ms, e.terms.handoff_ms, by_proc[e.processor]
            )
        if e.processor == home and e.terms is not None:
            changes["session_ms"] = round(session, 6)
        if changes:
            changes["calibrated"] = label
            e = _with_terms(e, **changes)
        entries.append(e)
    return dataclasses.replace(profile, entries=tuple(entries)), list(fits.values())
