"""Split operators across two processors at once (CoDL-style), chosen from the profile.

A plan whose nodes all run on one processor ``a`` can hand part of some operators' work to a second
processor ``b`` that would otherwise wait: a run of row-local nodes cut along the image height, or
a Conv/Gemm/MatMul cut along its output channels (:mod:`edgesplit.model.pieces`). Each piece runs
its share of the rows or channels on its own processor, both at once, and a join concatenates them.

How a split is chosen. For every candidate (each run of up to :data:`MAX_JOIN` consecutive row
segments, each channel-cuttable head), every cut position is priced from the profile: a piece costs
its nodes' profiled times scaled by the share of rows (halo included) or channels it computes, plus
the fixed cost of a part and its boundary bytes on its processor, and ``b``'s piece a hand-off; the
split costs the slower piece and the join (a copy of the output). Its gain is what the run costs on
``a`` alone minus that. The splits kept are the set of non-overlapping candidates of the largest
total gain (weighted interval scheduling over graph order).

Then the splits are written into the model (:func:`edgesplit.model.pieces.rewrite`), the profile's
node costs carried over to the pieces (:func:`derived_profile`), and the plan made and priced like
any other, by the part-level schedule; it replaces the plan only where that predicts it faster.
The runtime measures it like any other plan (``deploy`` ships it only when it measures faster).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgesplit.model.graph import ModelGraph
from edgesplit.model.pieces import Split, channel_axis, channel_segment, piece_nodes, rewrite
from edgesplit.model.rows import (
    H_AXIS,
    Rows,
    RowSegment,
    join,
    needed_rows,
    row_segments,
    row_shares,
)
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.overheads import whole_model_scale
from edgesplit.profile.store import NodeCost, ProcessorProfile, Profile

MAX_JOIN = 4
"""The most consecutive row segments one split covers (its halo grows with every convolution)."""

MIN_SIZE = 4
"""The fewest rows or channels a split cuts."""

COPY_MS_PER_MB = 0.1
"""What copying a MB costs a slice or a join where the profile has no measured rate (a memcpy at
about 10 GB/s)."""


@dataclass(frozen=True)
class Candidate:
    """One split and what it is predicted to save, over node indices ``first..last``."""

    split: Split
    first: int
    last: int
    gain_ms: float
    whole_ms: float
    split_ms: float


def fractions(graph: ModelGraph, split: Split) -> list[dict[str, float]]:
    """Per piece of ``split``: each node's share of its whole work that the piece computes (rows
    with their halo, or channels)."""
    out = []
    if split.kind == "channels":
        axis = channel_axis(graph, graph.index[split.nodes[0]])
        size = graph.tensors[split.output].shape[axis] if axis is not None else 1
        for lo, hi in split.bands:
            out.append(dict.fromkeys(split.nodes, (hi - lo) / size))
        return out
    seg = RowSegment(tuple(graph.index[n] for n in split.nodes), split.input, split.output, 0, 0)
    for lo, hi in split.bands:
        out.append(
            {graph.nodes[k].name: f for k, f in row_shares(graph, seg, Rows(lo, hi)).items()}
        )
    return out


def derived_profile(
    profile: Profile, graph: ModelGraph, rewritten: ModelGraph, splits: Sequence[Split]
) -> Profile:
    """``profile`` carried over to the rewritten model: a piece's node costs its original's times
    its share (:func:`fractions`); its slices and the join cost their bytes at the pair's measured
    rate of bytes into a part (else :data:`COPY_MS_PER_MB`). Each entry's node costs keep the
    calibration to the whole model that the original had (its whole-model time is not the rewritten
    model's, so it is dropped)."""
    share: dict[str, tuple[str, float]] = {}
    for s in splits:
        for k, (frac, nodes) in enumerate(zip(fractions(graph, s), piece_nodes(s, rewritten))):
            tag = f"@{s.tag(k)}"
            for i in nodes:
                name = rewritten.nodes[i].name
                orig = name.split(tag)[0]
                if orig in frac and name == orig + tag:
                    share[name] = (orig, frac[orig])
    n_orig = len(graph.nodes)
    entries = []
    for e in profile.entries:
        covers = len(e.nodes) == n_orig and all(n.name in e.nodes for n in graph.nodes)
        node_scale = e.terms.node_scale if e.terms is not None else 1.0
        scale = whole_model_scale(e, covers) / node_scale
        rate = (
            e.terms.input_ms_per_mb
            if e.terms is not None and e.terms.input_ms_per_mb
            else COPY_MS_PER_MB
        ) / 1e6
        nodes: dict[str, NodeCost] = {}
        for node in rewritten.nodes:
            cost = _node_cost(node, e, share, rate, rewritten)
            if cost is not None:
                nodes[node.name] = replace(
                    cost, latency_ms=cost.latency_ms * scale, p90_ms=cost.p90_ms * scale
                )
        terms = _derived_terms(e.terms, rewritten, share) if e.terms is not None else None
        entries.append(
            replace(e, nodes=nodes, whole_model_ms=None, whole_model_p90_ms=None, terms=terms)
        )
    return replace(profile, entries=tuple(entries))


def _origin(name: str) -> str:
    """The original tensor or node a piece's one is made from (``<name>@<tag>...``)."""
    return name.split("@", 1)[0]


def _derived_terms(t, rewritten: ModelGraph, share: dict[str, tuple[str, float]]):
    """The boundary terms for the pieces' tensors and nodes: a piece's tensor is blocked where its
    original is, and its reorders cost the original's times the piece's share (its band's bytes);
    a piece's node reads blocked inputs where its original does."""
    blocked = set(t.blocked_tensors)
    readers = set(t.blocked_readers)
    frac_of = {name: f for name, (_, f) in share.items()}
    new_in, new_out = dict(t.reorder_in_ms), dict(t.reorder_out_ms)
    for node in rewritten.nodes:
        if "@" not in node.name:
            continue
        orig = _origin(node.name)
        frac = frac_of.get(node.name, 1.0)
        if orig in readers:
            readers.add(node.name)
        for x in node.outputs:
            src = _origin(x)
            if src in blocked and x != src:
                blocked.add(x)
                for table in (new_in, new_out):
                    if src in table:
                        table[x] = table[src] * frac
    return replace(
        t,
        blocked_tensors=tuple(sorted(blocked)),
        blocked_readers=tuple(sorted(readers)),
        reorder_in_ms=new_in,
        reorder_out_ms=new_out,
    )


def _node_cost(node, e: ProcessorProfile, share, rate: float, graph: ModelGraph) -> NodeCost | None:
    if node.name in e.nodes:
        return e.nodes[node.name]
    if node.name in share:
        orig, frac = share[node.name]
        c = e.nodes.get(orig)
        if c is None:
            return None
        mj = c.energy_mj * frac if c.energy_mj is not None else None
        return replace(c, latency_ms=c.latency_ms * frac, p90_ms=c.p90_ms * frac, energy_mj=mj)
    if node.op_type in ("Slice", "Concat", "Identity") and (
        "@" in node.name or node.name.endswith(".join")
    ):
        if not e.nodes:
            return None
        ms = sum(graph.tensors[t].nbytes for t in node.outputs) * rate
        return NodeCost(ms, ms, source="predicted")
    return None


# ---- choosing


def _part_extra_ms(cm: CostModel, p: int, in_nbytes: int, out_nbytes: int) -> float:
    """A part's fixed cost and its boundary bytes on processor p (with ORT's layout reorders)."""
    c = cm.ov.cost(p, cm.backend[0][p])
    reorder = (in_nbytes + out_nbytes) * c.reorder_ms_per_byte
    return c.part_ms + in_nbytes * c.in_ms_per_byte + out_nbytes * c.out_ms_per_byte + reorder


def _row_cost(graph: ModelGraph, cm: CostModel, seg: RowSegment, rows: Rows, p: int) -> float:
    total = sum(float(cm.node_ms[k, p]) * f for k, f in row_shares(graph, seg, rows).items())
    x, y = graph.tensors[seg.input], graph.tensors[seg.output]
    band = needed_rows(graph, seg, rows)[seg.input]
    return total + _part_extra_ms(
        cm, p, x.nbytes * band.n // x.shape[H_AXIS], y.nbytes * rows.n // y.shape[H_AXIS]
    )


IDLE_GAP_MS = 5.0
"""How long the second processor is taken to have idled before each piece it is handed: its
hand-off grows with the gap (0.06 ms at none to 0.27 ms at 20 ms for ``host-biglittle``'s
little)."""


def _join_ms(cm: CostModel, a: int, nbytes: int) -> float:
    """The join on ``a``: a part of its own (fixed cost, the pieces' bytes in, their copy) and the
    hand-off back to ``a``'s worker when the other piece ends last."""
    c = cm.ov.cost(a, cm.backend[0][a])
    return c.part_ms + nbytes * (c.in_ms_per_byte + COPY_MS_PER_MB / 1e6) + cm.ov.handoff(a, 0.0)


def _best_cut(size: int, cost_a, cost_b, join_ms: float) -> tuple[int, float]:
    """The cut t (piece a: [0, t), piece b: [t, size)) of the least split cost."""
    best = (0, float("inf"))
    step = max(1, size // 64)
    for t in range(step, size, step):
        ms = max(cost_a(0, t), cost_b(t, size)) + join_ms
        if ms < best[1]:
            best = (t, ms)
    return best


def row_candidates(graph: ModelGraph, cm: CostModel, a: int, b: int) -> list[Candidate]:
    """Each run of up to :data:`MAX_JOIN` consecutive row segments, split at its best cut."""
    units = row_segments(graph)
    out = []
    for i in range(len(units)):
        for j in range(i, min(i + MAX_JOIN, len(units))):
            if j > i and units[j - 1].output != units[j].input:
                break
            seg = join(units[i : j + 1])
            if seg.out_height < MIN_SIZE:
                continue
            out.append(_row_candidate(graph, cm, seg, a, b))
    return [c for c in out if c is not None]


def _row_candidate(
    graph: ModelGraph, cm: CostModel, seg: RowSegment, a: int, b: int
) -> Candidate | None:
    whole = float(cm.node_ms[list(seg.nodes), a].sum())
    if not np.isfinite(whole) or not np.isfinite(cm.node_ms[list(seg.nodes), b]).all():
        return None
    handoff = cm.ov.handoff(b, IDLE_GAP_MS)
    join_ms = _join_ms(cm, a, graph.tensors[seg.output].nbytes)
    t, ms = _best_cut(
        seg.out_height,
        lambda lo, hi: _row_cost(graph, cm, seg, Rows(lo, hi), a),
        lambda lo, hi: _row_cost(graph, cm, seg, Rows(lo, hi), b) + handoff,
        join_ms,
    )
    if not t:
        return None
    names = tuple(graph.nodes[k].name for k in seg.nodes)
    split = Split(
        "rows",
        names,
        seg.input,
        seg.output,
        ((0, t), (t, seg.out_height)),
        (cm.processors[a], cm.processors[b]),
    )
    return Candidate(split, seg.nodes[0], seg.nodes[-1], whole - ms, whole, ms)


def channel_candidates(graph: ModelGraph, cm: CostModel, a: int, b: int) -> list[Candidate]:
    """Each channel-cuttable head with the per-channel nodes after it, split at its best cut."""
    out = []
    for k in range(len(graph.nodes)):
        chain = channel_segment(graph, k)
        if chain is not None:
            found = _channel_candidate(graph, cm, chain, a, b)
            if found is not None:
                out.append(found)
    return out


def _channel_candidate(
    graph: ModelGraph, cm: CostModel, chain: tuple[int, ...], a: int, b: int
) -> Candidate | None:
    axis = channel_axis(graph, chain[0])
    y = graph.nodes[chain[-1]].outputs[0]
    size = graph.tensors[y].shape[axis]  # type: ignore[index]
    nodes = list(chain)
    if size < MIN_SIZE or not np.isfinite(cm.node_ms[nodes][:, [a, b]]).all():
        return None
    whole = float(cm.node_ms[nodes, a].sum())
    x = graph.nodes[chain[0]].inputs[0]
    x_nbytes, y_nbytes = graph.tensors[x].nbytes, graph.tensors[y].nbytes
    handoff = cm.ov.handoff(b, IDLE_GAP_MS)

    def cost(lo: int, hi: int, p: int) -> float:
        frac = (hi - lo) / size
        return float(cm.node_ms[nodes, p].sum()) * frac + _part_extra_ms(
            cm, p, x_nbytes, int(y_nbytes * frac)
        )

    join_ms = _join_ms(cm, a, y_nbytes)
    t, ms = _best_cut(
        size, lambda lo, hi: cost(lo, hi, a), lambda lo, hi: cost(lo, hi, b) + handoff, join_ms
    )
    if not t:
        return None
    names = tuple(graph.nodes[i].name for i in chain)
    split = Split(
        "channels", names, x, y, ((0, t), (t, size)), (cm.processors[a], cm.processors[b])
    )
    return Candidate(split, chain[0], chain[-1], whole - ms, whole, ms)


def choose(cands: Sequence[Candidate], min_gain_ms: float = 0.0) -> list[Candidate]:
    """The non-overlapping candidates (by node range) of the largest total gain, each gaining more
    than ``min_gain_ms``; in graph order."""
    good = sorted((c for c in cands if c.gain_ms > min_gain_ms), key=lambda c: c.last)
    if not good:
        return []
    ends = [c.last for c in good]
    best = [0.0] * (len(good) + 1)
    take: list[int] = [-1] * (len(good) + 1)
    for i, c in enumerate(good, start=1):
        prev = int(np.searchsorted(ends, c.first, side="left"))  # candidates ending before c starts
        with_c = best[prev] + c.gain_ms
        if with_c > best[i - 1]:
            best[i], take[i] = with_c, prev
        else:
            best[i] = best[i - 1]
    out, i = [], len(good)
    while i > 0:
        if take[i] >= 0 and best[i] != best[i - 1]:
            out.append(good[i - 1])
            i = take[i]
        else:
            i -= 1
    return out[::-1]


def pair(cm: CostModel, assign: np.ndarray) -> tuple[int, int] | None:
    """The processors a split shares work between: ``a``, the local processor the assignment puts
    the most work on, and ``b``, the fastest other local one (on the whole model) that shares no
    core with ``a`` and runs every node; None when there is none."""
    x = np.asarray(assign)
    local = [p for p in range(cm.n_procs) if not cm.remote[p]]
    work = {
        p: float(np.where(x == p, cm.node_ms[np.arange(cm.n_nodes), x], 0.0).sum()) for p in local
    }
    a = max(local, key=lambda p: work[p])
    others = [
        q
        for q in local
        if q != a
        and not cm.blocks[a, q]
        and np.isfinite(cm.node_ms[:, q]).all()
        and cm.kinds[q] == cm.kinds[a]
    ]
    if not others or work[a] <= 0:
        return None
    return a, min(others, key=lambda q: float(cm.node_ms[:, q].sum()))


def plan_splits(plan_splits_json: Sequence) -> list[Split]:
    """A plan's recorded splits (:attr:`edgesplit.optimize.plan.Plan.splits`)."""
    from edgesplit.errors import PlanError

    try:
        return [Split.from_json(s) for s in plan_splits_json]
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"splits: not a valid split ({e})") from e


def for_plan(graph: ModelGraph, splits_json: Sequence, profile: Profile | None = None):
    """The model as a plan with ``splits_json`` sees it (the splits written in), and ``profile``
    carried over to it (None when not given)."""
    splits = plan_splits(splits_json)
    if not splits:
        return graph, profile
    rewritten = rewrite(graph, splits)
    return rewritten, derived_profile(
        profile, graph, rewritten, splits
    ) if profile is not None else None
