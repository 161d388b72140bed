"""What a plan pays beyond its nodes and crossings, as the runtime executes it, from the profile.

The runtime runs whole *parts* (:func:`edgesplit.optimize.parts.part_labels`), one at a time per
processor worker, and every part run, part boundary and request costs something the per-node
figures miss. The profiler measures each of these on the device (:class:`~edgesplit.profile.
store.RunTerms`); this module turns them into arrays indexed like the :class:`CostModel`:

* **per part run** on (processor, backend): ``part_ms``;
* **per tensor leaving a part** (read by another part): ``out_ms_per_byte`` x bytes, plus a layout
  reorder where the backend holds that tensor blocked there: the profiler's figure for that very
  tensor (``PairCost.reorder_out_ms``), else ``reorder_ms_per_byte`` x bytes;
* **per tensor entering a part**: ``in_ms_per_byte`` x bytes and ``crossing_ms``, plus a reorder
  where a node of the part reads it in the blocked layout;
* **per hand-off**: a part submitted to an idle worker waits for the thread to wake, which takes
  longer the longer the worker has idled (``handoff_ms`` interpolated over ``handoff_gaps_ms``);
* **per request**: ``session_ms``, and the caller's wake-up at the end after waiting for the whole
  request (``return_ms`` over ``return_gaps_ms``, the home processor's figures);
* **contention**: a part on processor p runs ``contention[p, q]`` times slower while q is busy.

Graph inputs and outputs are no part boundary: a whole-model run pays for them too, so they are in
the node costs (which :func:`edgesplit.optimize.costs.build_costs` calibrates net of these terms).
Where the profile has no terms (predicted entries, older profiles) the per-part cost is the entry's
``dispatch_ms`` and everything else is zero.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from edgesplit.profile.store import ProcessorProfile, Profile, RunTerms

MB = 1e6
NOISE_CAP = 0.10  # the widest relative band within which plans count as equal (see noise_rel)
MIN_SCALE = 0.25  # the least whole-model calibration of node costs (see whole_model_scale)


@dataclass(frozen=True)
class PairCost:
    """The per-part terms of one (processor, backend) pair, in ms and ms per byte;
    ``reorder_in_ms``/``reorder_out_ms``: tensor -> one reorder of it into / out of the blocked
    layout, where the profiler measured that tensor's shape."""

    part_ms: float = 0.0
    in_ms_per_byte: float = 0.0
    out_ms_per_byte: float = 0.0
    reorder_ms_per_byte: float = 0.0
    crossing_ms: float = 0.0
    reorder_in_ms: Mapping[str, float] = field(default_factory=dict)
    reorder_out_ms: Mapping[str, float] = field(default_factory=dict)

    def reorder_ms(self, tensor: str, nbytes: int, leaving: bool) -> float:
        """One reorder of ``tensor`` out of the blocked layout (``leaving`` its producer's part)
        or into it (entering a blocked reader's part)."""
        got = (self.reorder_out_ms if leaving else self.reorder_in_ms).get(tensor)
        return nbytes * self.reorder_ms_per_byte if got is None else got


ZERO = PairCost()


def interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """``np.interp`` at one point, by its arithmetic, without its per-call cost (a schedule asks
    for hand-offs thousands of times per plan)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect_right(xs, x) - 1
    if xs[j] == x:
        return ys[j]
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return slope * (x - xs[j]) + ys[j]


@dataclass(frozen=True, eq=False)
class Overheads:
    """The terms of :mod:`edgesplit.optimize.overheads`, indexed by processor, node and flow.

    Attributes:
        pair: ``(processor index, backend key) -> PairCost``; absent pairs cost nothing.
        blocked_out: ``(F, P)``: flow f's tensor is held blocked when its producer runs on p.
        blocked_in: ``(N, P)``: node n reads its inputs blocked on p.
        handoff_gaps_ms, handoff_ms: ``(P, G)`` each: the hand-off after each idle gap.
        return_gaps_ms, return_ms: ``(G,)``: the caller's wake-up after waiting each gap.
        session_ms: Per request.
        solo_session_ms: Per request of a plan of one local part, run on the caller's thread (None:
            ``session_ms``; see :attr:`caller_session_ms`).
        contention: ``(P, P)``, at least 1; ``[p, q]``: p's slowdown while q is busy.
        stream_gap_ms: ``(P,)``: in a stream, a busy worker's gap before its next queued part, as
            calibrated, else the hand-off at zero idle gap (None: the hand-offs; see
            :meth:`stream_gaps`).
        active_w: ``(P,)`` active power (for the energy of the overhead time; 0 on servers).
        noise_rel: Relative spread of the measurements; plans closer than this are equal.
        call_ms, call_ms_per_byte: A part on a server processor: its call beyond the link and its
            compute, per call and per byte it sends or receives (graph inputs and outputs
            included), charged to the part's run (``RunTerms.remote_call_ms``; 0 until fitted).
    """

    pair: Mapping[tuple[int, str], PairCost]
    blocked_out: np.ndarray
    blocked_in: np.ndarray
    handoff_gaps_ms: np.ndarray
    handoff_ms: np.ndarray
    return_gaps_ms: np.ndarray = field(default_factory=lambda: np.zeros(1))
    return_ms: np.ndarray = field(default_factory=lambda: np.zeros(1))
    session_ms: float = 0.0
    solo_session_ms: float | None = None
    contention: np.ndarray | None = None
    active_w: np.ndarray | None = None
    noise_rel: float = 0.0
    stream_gap_ms: np.ndarray | None = None
    call_ms: float = 0.0
    call_ms_per_byte: float = 0.0

    def cost(self, p: int, backend: str | None) -> PairCost:
        return self.pair.get((p, backend or ""), ZERO)

    @cached_property
    def _handoff_curves(self) -> tuple[tuple[list[float], list[float]], ...]:
        return tuple(
            (g.tolist(), h.tolist()) for g, h in zip(self.handoff_gaps_ms, self.handoff_ms)
        )

    def handoff(self, p: int, gap_ms: float) -> float:
        """The hand-off onto processor p's worker after it idled ``gap_ms``."""
        return interp(gap_ms, *self._handoff_curves[p])

    def stream_gaps(self) -> np.ndarray:
        """``(P,)``: in a stream, how long after a part's outputs are collected each processor's
        worker starts its next queued part: as calibrated, else its hand-off at zero idle gap."""
        if self.stream_gap_ms is not None:
            return self.stream_gap_ms
        return np.array([self.handoff(p, 0.0) for p in range(len(self.handoff_ms))])

    def wake(self, gap_ms: float) -> float:
        """The caller's wake-up at the end of a request that took ``gap_ms``."""
        return float(np.interp(gap_ms, self.return_gaps_ms, self.return_ms))

    def is_zero(self) -> bool:
        """True when nothing is paid beyond nodes and crossings (then parts cost nothing)."""
        return (
            not any(c != ZERO for c in self.pair.values())
            and not self.handoff_ms.any()
            and not self.return_ms.any()
            and self.session_ms == 0
            and not self.solo_session_ms
            and self.call_ms == 0
            and self.call_ms_per_byte == 0
            and (self.contention is None or bool((self.contention <= 1.0).all()))
        )

    @property
    def caller_session_ms(self) -> float:
        """The Session's work per request of a plan of one local part (the caller runs it: no
        request object, no future; checked after the run). A throttled part goes the general way
        (about 30-50 us more here), which this leaves out."""
        return self.session_ms if self.solo_session_ms is None else self.solo_session_ms

    def slowdown(self, p: int, q: int) -> float:
        return 1.0 if self.contention is None else float(self.contention[p, q])

    def sequential_extra(self, remote: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(alpha, beta)`` (P, P) to add to a crossing's cost in the sequential (linear) forms,
        which cannot see parts: a crossing onto another local processor starts a part there, so
        it pays that part's fixed cost and a back-to-back hand-off, and the bytes go out of one
        part and into the other; a crossing onto a server starts a call, and every byte to or from
        one pays the call's cost per byte."""
        n = len(remote)
        alpha, beta = np.zeros((n, n)), np.zeros((n, n))
        for p in range(n):
            for q in range(n):
                if p != q and remote[q] != remote[p]:  # a call to the server, or its answer
                    alpha[p, q] = self.call_ms if remote[q] else 0.0
                    beta[p, q] = self.call_ms_per_byte
                if p == q or remote[p] or remote[q]:
                    continue
                into = [c for (k, _), c in self.pair.items() if k == q]
                out = [c for (k, _), c in self.pair.items() if k == p]
                alpha[p, q] = min(
                    (c.part_ms + c.crossing_ms for c in into), default=0.0
                ) + self.handoff(q, 0.0)
                beta[p, q] = min((c.out_ms_per_byte for c in out), default=0.0) + min(
                    (c.in_ms_per_byte for c in into), default=0.0
                )
        return alpha, beta


def none(n_nodes: int, n_procs: int, n_flows: int) -> Overheads:
    """No overheads at all (a cost model made in code, or a profile without terms)."""
    return Overheads(
        pair={},
        blocked_out=np.zeros((n_flows, n_procs), dtype=bool),
        blocked_in=np.zeros((n_nodes, n_procs), dtype=bool),
        handoff_gaps_ms=np.zeros((n_procs, 1)),
        handoff_ms=np.zeros((n_procs, 1)),
    )


def _terms_of(profile: Profile, processor: str) -> list[RunTerms]:
    """The terms measured for a processor's entries, those with contention figures first (the
    per-processor terms, hand-offs and contention, are read from the first)."""
    terms = [e.terms for e in profile.for_processor(processor) if e.terms is not None]
    return sorted(terms, key=lambda t: not t.contention)


def _pair_cost(entry: ProcessorProfile) -> PairCost:
    t = entry.terms
    if t is None:
        return PairCost(part_ms=entry.dispatch_ms or 0.0)
    return PairCost(
        part_ms=t.part_fixed_ms,
        in_ms_per_byte=t.input_ms_per_mb / MB,
        out_ms_per_byte=t.output_ms_per_mb / MB,
        reorder_ms_per_byte=(t.reorder_ms_per_mb or 0.0) / MB,
        crossing_ms=t.crossing_ms,
        reorder_in_ms=dict(t.reorder_in_ms),
        reorder_out_ms=dict(t.reorder_out_ms),
    )


def _curve(terms: list[RunTerms], returns: bool = False) -> tuple[np.ndarray, np.ndarray]:
    for t in terms:
        values = t.return_ms if returns else t.handoff_ms
        if values and len(values) == len(t.handoff_idle_ms):
            return np.asarray(t.handoff_idle_ms, dtype=float), np.asarray(values, dtype=float)
    return np.zeros(1), np.zeros(1)


def noise_rel(profile: Profile) -> float:
    """The measurements' relative spread: the largest over measured entries of p90 / median - 1 of
    the whole-model runs, capped at :data:`NOISE_CAP` (0 for a profile of predictions only).

    The largest, not the median: a plan's figures are no surer than its noisiest processor's, and
    the pairs that sample the machine's drift (leveled in rounds, :mod:`edgesplit.profile.level`)
    spread most. With the median, short TVM blocks (1-5%) hid the leveled ORT pairs' 5-23%: a
    4-part big+little mobilenetv2 plan predicted 8.6% faster than big alone (more than the median
    spread, 6%; less than the largest, 8.8%) measured 1.305x big alone (plan_truth, 2026-12-01)."""
    spreads = [
        e.whole_model_p90_ms / e.whole_model_ms - 1.0
        for e in profile.entries
        if e.source == "measured" and e.whole_model_ms and e.whole_model_p90_ms
    ]
    return float(min(max(max(spreads), 0.0), NOISE_CAP)) if spreads else 0.0


def build_overheads(
    profile: Profile,
    processors: Sequence,
    backend: Sequence[Sequence[str | None]],
    node_names: Sequence[str],
    flows: Sequence,
    home: int,
) -> Overheads:
    """The overheads of a model on ``processors`` (the cost model's, server ones last), with
    ``backend[n][p]`` the backend node n uses on p and ``flows`` the cost model's flows."""
    n_procs, n_nodes = len(processors), len(node_names)
    pair: dict[tuple[int, str], PairCost] = {}
    blocked_out = np.zeros((len(flows), n_procs), dtype=bool)
    blocked_in = np.zeros((n_nodes, n_procs), dtype=bool)
    curves = []
    contention = np.ones((n_procs, n_procs))
    stream_gap = np.zeros(n_procs)
    names = [p.name for p in processors]
    for p, proc in enumerate(processors):
        by_backend = {e.backend: e for e in profile.for_processor(proc.name)}
        for key, entry in by_backend.items():
            pair[p, key] = _pair_cost(entry)
            t = entry.terms
            if t is None:
                continue
            tensors, readers = set(t.blocked_tensors), set(t.blocked_readers)
            for i, f in enumerate(flows):
                if f.src >= 0 and backend[f.src][p] == key and f.tensor in tensors:
                    blocked_out[i, p] = True
            for n, name in enumerate(node_names):
                if backend[n][p] == key and name in readers:
                    blocked_in[n, p] = True
        terms = _terms_of(profile, proc.name)
        curves.append(_curve(terms))
        stream_gap[p] = np.interp(
            0.0, *curves[-1]
        )  # the hand-off at zero idle gap, unless calibrated
        for t in terms[:1]:
            if t.stream_gap_ms is not None:
                stream_gap[p] = t.stream_gap_ms
            for other, factor in t.contention.items():
                if other in names:
                    contention[p, names.index(other)] = max(float(factor), 1.0)
    width = max(len(g) for g, _ in curves)
    gaps = np.array([np.pad(g, (0, width - len(g)), mode="edge") for g, _ in curves])
    handoff = np.array([np.pad(v, (0, width - len(v)), mode="edge") for _, v in curves])
    home_terms = _terms_of(profile, processors[home].name)
    r_gaps, r_ms = _curve(home_terms, returns=True)
    return Overheads(
        pair=pair,
        blocked_out=blocked_out,
        blocked_in=blocked_in,
        handoff_gaps_ms=gaps,
        handoff_ms=handoff,
        return_gaps_ms=r_gaps,
        return_ms=r_ms,
        session_ms=home_terms[0].session_ms if home_terms else 0.0,
        solo_session_ms=home_terms[0].solo_session_ms if home_terms else None,
        call_ms=home_terms[0].remote_call_ms if home_terms else 0.0,
        call_ms_per_byte=home_terms[0].remote_call_ms_per_mb / MB if home_terms else 0.0,
        contention=contention,
        active_w=np.array([0.0 if p.is_remote else p.active_w for p in processors]),
        noise_rel=noise_rel(profile),
        stream_gap_ms=stream_gap,
    )


def whole_model_scale(entry: ProcessorProfile, n_covered: bool) -> float:
    """The factor on an entry's node costs that makes a one-part plan of the whole model cost
    what the profiler measured for it (``whole_model_ms``: a hand-off, the run, the caller's
    wake-up), net of the terms charged separately; 1 where it cannot be known."""
    total = entry.sum_ms
    t = entry.terms
    if not (entry.whole_model_ms and n_covered and total > 0):
        scale = 1.0
    elif t is None:
        scale = entry.whole_model_ms / total
    else:
        whole = entry.whole_model_ms
        gaps = t.handoff_idle_ms or (0.0,)
        h0 = t.handoff_ms[0] if t.handoff_ms else 0.0
        back = float(np.interp(whole, gaps, t.return_ms)) if len(t.return_ms) == len(gaps) else 0.0
        # a model whose whole run the terms nearly explain (a few tiny kernels) keeps a floor
        scale = max((whole - t.part_fixed_ms - h0 - back) / total, MIN_SCALE)
    return scale * (t.node_scale if t is not None else 1.0)
