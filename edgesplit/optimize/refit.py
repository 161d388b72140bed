"""Refit a profile's cost terms from a bundle's measured part runs: the pure half of ``calibrate``.

The runtime half (:mod:`edgesplit.workflows.refit`) runs one or more bundles of the same model and
device and reduces each one's timing records to a :class:`Measured`; :func:`fit_profile` then fits
a few terms on all of them together (an :class:`Observed` per bundle), not the parts themselves, so
that other plans of the same model and device gain too. One bundle alone can leave terms
confounded (a few parts of similar sizes cannot tell a node scale from a fixed cost); a whole model
on one processor beside a plan of many parts pins both:

* per (processor, backend) pair that ran parts: a scale on node costs (``node_scale``), the fixed
  cost of a part run (``part_fixed_ms``) and a cost per tensor entering a part (``crossing_ms``),
  by least squares of the measured part runs (start to done, on the worker) against the modelled
  ones, net of the terms kept (bytes, reorders, contention), with a prior that holds each term to
  its measured value where the parts cannot tell them apart (few parts, similar sizes). Where a
  whole model ran on the processor, its runs alone set the node scale, and the other parts the
  fixed and crossing costs (:func:`_anchored`);
* per processor: the hand-off curve, where the runs gave at least :data:`MIN_SAMPLES` hand-offs
  near a gap of the curve;
* per request: the Session's own work, from the wall-clock latency of ``Session.run`` against the
  span its records cover, less the modelled caller wake-up;
* per call to a server (bundles run against one, ``calibrate --server``): what a call costs beyond
  the link's modelled time and the part's compute there (the ``Server-Timing`` the server sends),
  a fixed cost and a cost per MB sent or received, by least squares over every server part's
  calls with a prior at 0 (:func:`fit_remote_call`). Server parts are left out of the pair fits:
  their runs on the device are whole calls.

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
# Contention from streams: the prior's spread on a slowdown (factor - 1), and the noise of a
# processor's stream/single ratio of part-run medians.
PRIOR_CONTENTION = 0.5
SPREAD_CONTENTION = 0.05
# A call to a server: the prior's spread on its fixed cost (ms) and on its cost per MB (ms), and a
# call's own noise, at least CALL_SPREAD_FLOOR of its median.
PRIOR_CALL_MS = 2.0
PRIOR_CALL_MS_PER_MB = 2.0
CALL_SPREAD_FLOOR = 0.05


@dataclass(frozen=True)
class RemoteCall:
    """One server part's calls as the device measured them (medians per call).

    Attributes:
        call_ms: The whole call, request sent to answer decoded. ``compute_ms``: the part's
            compute on the server (its ``Server-Timing`` compute; from a server that sends only its
            own time, that, and the call's fitted cost then leaves the server's HTTP handling out).
            ``sent_nbytes``, ``received_nbytes``: the request's and the answer's bytes per call.
    """

    call_ms: float
    compute_ms: float
    sent_nbytes: float
    received_nbytes: float
    calls: int


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
    stream: Streamed | None = None
    remote: Mapping[str, RemoteCall] = dataclasses.field(default_factory=dict)

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
            _merged_streams(self.stream, other.stream),
            {**self.remote, **other.remote},  # the later calls: the server's figures are cumulative
        )


@dataclass(frozen=True)
class Streamed:
    """A pipelined stream of the bundle's requests, measured after it filled: the period (ms per
    request) and each part's run on its worker (start to done, median), while the other
    processors' workers run other requests' parts; ``gaps_ms``: per processor, the median time
    from a part's outputs collected to the start of the next part already queued on its worker."""

    period_ms: float
    part_ms: Mapping[str, float]
    requests: int
    gaps_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def merged(self, other: Streamed) -> Streamed:
        w = self.requests / (self.requests + other.requests)
        mix = lambda a, b: w * a + (1 - w) * b  # noqa: E731
        return Streamed(
            mix(self.period_ms, other.period_ms),
            {k: mix(v, other.part_ms.get(k, v)) for k, v in self.part_ms.items()},
            self.requests + other.requests,
            {
                **other.gaps_ms,
                **{k: mix(v, other.gaps_ms.get(k, v)) for k, v in self.gaps_ms.items()},
            },
        )


def _merged_streams(a: Streamed | None, b: Streamed | None) -> Streamed | None:
    return a.merged(b) if a is not None and b is not None else (a or b)


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
                contention=dict(measured.get("contention", t.contention)),
                stream_gap_ms=measured.get("stream_gap_ms"),
                remote_call_ms=0.0,
                remote_call_ms_per_mb=0.0,
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


@dataclass(frozen=True, eq=False)
class Observed:
    """One bundle's plan priced under the profile being calibrated, and its measured runs.

    Attributes:
        cm: The plan's problem under the profile (each node on the plan's processor and backend).
        assign: Each node's processor. ``parts``: the plan's parts (node indices, the bundle's
            order; None: the optimiser's for ``assign``), named ``names`` in the same order.
    """

    cm: CostModel
    assign: np.ndarray
    names: tuple[str, ...]
    measured: Measured
    parts: tuple[tuple[int, ...], ...] | None = None


def _pair_rows(ob: Observed) -> dict[tuple[str, str], list[tuple[list[float], float, float, bool]]]:
    """Per (processor, backend) of ``ob``'s parts: each measured part's row of the fit
    (``[1, node ms, tensors entering]``), its measured run net of the terms kept, its spread, and
    whether it is a whole model on one processor (a plan of one part)."""
    cm, measured = ob.cm, ob.measured
    lay = layout(cm, ob.assign, ob.parts)
    sched = schedule(cm, ob.assign, ob.parts)
    entering = _entering(cm, lay.parts)
    out: dict[tuple[str, str], list] = {}
    for k, part in enumerate(lay.parts):
        name = ob.names[k]
        p = int(lay.proc[k])
        if name not in measured.part_ms or cm.remote[p]:  # a server part's run here is a whole call
            continue
        backend = cm.backend[part[0]][p] or ""
        pc = cm.ov.cost(p, backend)
        kept = float(sched.part_ms[k]) - lay.nodes_ms[k] - pc.part_ms - pc.crossing_ms * entering[k]
        row = [1.0, float(lay.nodes_ms[k]), float(entering[k])]
        out.setdefault((cm.processors[p], backend), []).append(
            (row, measured.part_ms[name] - kept, _spread(measured, name), len(lay.parts) == 1)
        )
    return out


def fit_pairs(observed: Sequence[Observed]) -> list[PairFit]:
    """Per pair that ran parts in any of ``observed``: node scale, fixed cost and crossing cost,
    fitted on every bundle's parts together (see the module doc). Bundles of one model and device
    pin different terms: a whole model on one processor its node scale, a plan of many small
    parts its fixed and crossing costs (:func:`_anchored`)."""
    rows: dict[tuple[str, str], list] = {}
    for ob in observed:
        for key, got in _pair_rows(ob).items():
            rows.setdefault(key, []).extend(got)
    cm = observed[0].cm if observed else None
    fits = []
    for (proc, backend), got in rows.items():
        pc = cm.ov.cost(cm.proc_index(proc), backend)
        a = np.array([r for r, _, _, _ in got])
        y = np.array([v for _, v, _, _ in got])
        sigma = np.array([s for _, _, s, _ in got])
        whole = np.array([w for _, _, _, w in got])
        prior = np.array([pc.part_ms, 1.0, pc.crossing_ms])
        spread = np.array([max(PRIOR_FIXED_MS, pc.part_ms), PRIOR_SCALE, PRIOR_CROSSING_MS])
        if whole.any():
            b = _anchored(a, y, sigma, whole, prior, spread)
        else:
            b = _ridge(a / sigma[:, None], y / sigma, prior, spread)
        fits.append(
            PairFit(
                proc,
                backend,
                float(max(b[1], 0.05)),
                float(max(b[0], 0.0)),
                float(max(b[2], 0.0)),
                len(got),
            )
        )
    return fits


def _call_rows(ob: Observed) -> list[tuple[float, float, float]]:
    """Per server part of ``ob`` that was called: ``(MB sent and received, the call net of the
    link's modelled time and the part's compute, the call's spread)``."""
    cm, rows = ob.cm, []
    lay = layout(cm, ob.assign, ob.parts)
    home = cm.home
    for k, name in enumerate(ob.names):
        p = int(lay.proc[k])
        got = ob.measured.remote.get(name)
        if got is None or not cm.remote[p] or got.calls == 0:
            continue
        link = (
            float(cm.link_ms[home, p] + cm.link_ms[p, home])
            + got.sent_nbytes * float(cm.link_ms_per_byte[home, p])
            + got.received_nbytes * float(cm.link_ms_per_byte[p, home])
        )
        mb = (got.sent_nbytes + got.received_nbytes) / 1e6
        spread = max(CALL_SPREAD_FLOOR * got.call_ms, SPREAD_MIN_MS)
        rows.append((mb, got.call_ms - link - got.compute_ms, spread))
    return rows


def fit_remote_call(observed: Sequence[Observed]) -> tuple[float, float, int] | None:
    """A server call's fixed cost (ms) and cost per MB (ms), fitted on every server part's calls
    (ridge towards 0: one payload size alone cannot tell them apart, and then the prior splits
    what the calls cost beyond the model), and how many parts they were fitted on; None when no
    server part was called. Both are at least 0."""
    rows = [r for ob in observed for r in _call_rows(ob)]
    if not rows:
        return None
    a = np.array([[1.0, mb] for mb, _, _ in rows])
    y = np.array([v for _, v, _ in rows])
    sigma = np.array([s for _, _, s in rows])
    b = _ridge(
        a / sigma[:, None], y / sigma, np.zeros(2), np.array([PRIOR_CALL_MS, PRIOR_CALL_MS_PER_MB])
    )
    return max(float(b[0]), 0.0), max(float(b[1]), 0.0), len(rows)


def _anchored(
    a: np.ndarray,
    y: np.ndarray,
    sigma: np.ndarray,
    whole: np.ndarray,
    prior: np.ndarray,
    spread: np.ndarray,
) -> np.ndarray:
    """``[fixed, scale, crossing]`` where some rows are whole models on the processor: the scale
    from
    those runs alone, which measure it directly (a fixed cost is a few hundredths of a whole
    model's run), and the fixed and crossing costs from the other parts given that scale (ridge
    towards the profile's). Fitted jointly, the many parts of a plan outweighed the one whole
    model: in 7 plan_truth runs of 2026-12-03/04 the fitted profile predicted the very whole-model
    bundles it was fitted on up to 33% high (median +0.9%, 12 of 84 over +4%)."""
    fixed, crossing = float(prior[0]), float(prior[2])
    rest = ~whole
    weight = 1.0 / sigma[whole] ** 2
    for _ in range(4):  # alternate: the whole rows hardly depend on the fixed cost, so this settles
        net = y[whole] - fixed - crossing * a[whole, 2]
        scale = float(
            (weight * net * a[whole, 1]).sum() / max((weight * a[whole, 1] ** 2).sum(), 1e-12)
        )
        if not rest.any():
            break
        cols = a[rest][:, [0, 2]] / sigma[rest, None]
        fixed, crossing = _ridge(
            cols, (y[rest] - scale * a[rest, 1]) / sigma[rest], prior[[0, 2]], spread[[0, 2]]
        )
    return np.array([fixed, scale, crossing])


def _stream_rows(ob: Observed) -> list[tuple[int, dict[int, float], float]]:
    """Per local processor with parts in ``ob``'s stream: how much longer its parts ran in the
    stream than alone (``sum stream / sum single - 1``) and how busy each other one was
    (its parts' stream time over the period, at most 1)."""
    cm, st = ob.cm, ob.measured.stream
    if st is None or st.period_ms <= 0:
        return []
    lay = layout(cm, ob.assign, ob.parts)
    single: dict[int, float] = {}
    streamed: dict[int, float] = {}
    for k, name in enumerate(ob.names):
        p = int(lay.proc[k])
        if cm.remote[p] or name not in st.part_ms or name not in ob.measured.part_ms:
            continue
        single[p] = single.get(p, 0.0) + ob.measured.part_ms[name]
        streamed[p] = streamed.get(p, 0.0) + st.part_ms[name]
    busy = {q: min(1.0, t / st.period_ms) for q, t in streamed.items()}
    return [
        (p, {q: u for q, u in busy.items() if q != p}, streamed[p] / single[p] - 1.0)
        for p in single
        if single[p] > 0 and len(busy) > 1
    ]


def fit_contention(observed: Sequence[Observed]) -> dict[tuple[str, str], float]:
    """Pairwise slowdowns ``(p, q) -> factor`` from the bundles' streams: in a stream, p's parts run
    while q's worker runs other requests' parts for the share of the period it is busy, so
    ``stream / single - 1 = sum over q of (factor[p, q] - 1) * busy[q]``; fitted per p over every
    stream (ridge towards the profiled factors), at least 1. Only pairs some stream overlapped."""
    rows: dict[int, list[tuple[dict[int, float], float]]] = {}
    for ob in observed:
        for p, busy, y in _stream_rows(ob):
            rows.setdefault(p, []).append((busy, y))
    if not observed:
        return {}
    cm = observed[0].cm
    out = {}
    for p, got in rows.items():
        others = sorted({q for busy, _ in got for q in busy})
        a = np.array([[busy.get(q, 0.0) for q in others] for busy, _ in got])
        y = np.array([v for _, v in got])
        prior = np.array([cm.ov.slowdown(p, q) - 1.0 for q in others])
        b = _ridge(
            a / SPREAD_CONTENTION,
            y / SPREAD_CONTENTION,
            prior,
            np.full(len(others), PRIOR_CONTENTION),
        )
        for q, x in zip(others, b):
            out[cm.processors[p], cm.processors[q]] = round(1.0 + max(float(x), 0.0), 4)
    return out


def fit_stream_gaps(observed: Sequence[Observed]) -> dict[str, float]:
    """Per processor: the median over the bundles' streams of its worker's gap before a queued part
    (see :meth:`~edgesplit.optimize.overheads.Overheads.stream_gaps`)."""
    got: dict[str, list[float]] = {}
    for ob in observed:
        st = ob.measured.stream
        for proc, gap in (st.gaps_ms if st is not None else {}).items():
            got.setdefault(proc, []).append(gap)
    return {proc: round(float(np.median(v)), 6) for proc, v in got.items()}


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
            "contention": dict(t.contention),
            "stream_gap_ms": t.stream_gap_ms,
        }
        changes.setdefault("calibrated_from", keep)
    return dataclasses.replace(e, terms=dataclasses.replace(t, **changes))


def fit_profile(
    observed: Sequence[Observed], profile: Profile, label: str
) -> tuple[Profile, list[PairFit]]:
    """``profile`` (the one each observation's ``cm`` was built from, uncalibrated) with terms
    fitted
    to every observed bundle together."""
    fits = {(f.processor, f.backend): f for f in fit_pairs(observed)}
    contention = fit_contention(observed)
    by_proc: dict[str, list[tuple[float, float]]] = {}
    for ob in observed:
        for proc, gap, h in ob.measured.handoffs:
            by_proc.setdefault(proc, []).append((gap, h))
    gaps = fit_stream_gaps(observed)
    call = fit_remote_call(observed)
    cm = observed[0].cm
    home = cm.processors[cm.home]
    session = float(
        np.median(
            [
                max(
                    ob.measured.latency_ms - ob.measured.span_ms - cm.ov.wake(ob.measured.span_ms),
                    0.0,
                )
                for ob in observed
            ]
        )
    )
    entries = []
    for e in profile.entries:
        changes: dict = {}
        f = fits.get((e.processor, e.backend))
        if f is not None:
            old = e.terms.node_scale if e.terms is not None else 1.0
            changes.update(
                node_scale=round(old * f.node_scale, 6), part_fixed_ms=round(f.part_fixed_ms, 6)
            )
            changes.update(crossing_ms=round(f.crossing_ms, 6))
        if e.terms is not None and by_proc.get(e.processor):
            changes["handoff_ms"] = fit_handoffs(
                e.terms.handoff_idle_ms, e.terms.handoff_ms, by_proc[e.processor]
            )
        if e.processor == home and e.terms is not None:
            changes["session_ms"] = round(session, 6)
            if call is not None:
                changes.update(
                    remote_call_ms=round(call[0], 6), remote_call_ms_per_mb=round(call[1], 6)
                )
        if e.terms is not None and e.processor in gaps:
            changes["stream_gap_ms"] = gaps[e.processor]
        slower = {q: f for (p, q), f in contention.items() if p == e.processor}
        if slower and e.terms is not None:
            changes["contention"] = {**e.terms.contention, **slower}
        if changes:
            changes["calibrated"] = label
            e = _with_terms(e, **changes)
        entries.append(e)
    return dataclasses.replace(profile, entries=tuple(entries)), list(fits.values())
