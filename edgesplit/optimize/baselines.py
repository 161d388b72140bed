"""The baselines every plan is compared with, priced by the same cost model and schedule.

* ``only:<processor>``: the whole model on one device processor (where it runs every op).
* ``server-only``: the whole model on the best server processor; input up, output down.
* ``best-single-cut``: Neurosurgeon (ASPLOS 2017): one split point in topological order, the prefix
  on the device's best single processor, the suffix on the best server processor; every cut is
  priced and the best kept.
* ``ort-greedy``: what ONNX Runtime's execution-provider order does: each node to the first device
  processor that supports it, accelerators first (npu, gpu, dsp, then cpu; spec order within a
  kind).

Baselines model other systems, so they ignore ``--pin``; support and memory are still checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import feasible, sequential_cost

PROVIDER_ORDER = ("npu", "gpu", "dsp", "cpu")


@dataclass(frozen=True)
class Candidate:
    """A baseline's assignment (``None`` when it cannot run) and a one-line summary."""

    name: str
    assign: np.ndarray | None
    summary: str


def _runs_all(cm: CostModel, p: int) -> bool:
    return bool(np.isfinite(cm.node_ms[:, p]).all())


def _whole(cm: CostModel, p: int) -> np.ndarray:
    return np.full(cm.n_nodes, p, dtype=np.int64)


def _best_whole(cm: CostModel, procs: list[int]) -> int | None:
    """The processor (of ``procs``) that runs the whole model fastest, if any runs it all."""
    ok = [p for p in procs if _runs_all(cm, p) and feasible(cm, _whole(cm, p), pins=False)]
    if not ok:
        return None
    return min(ok, key=lambda p: sequential_cost(cm, _whole(cm, p), "latency"))


def cut_costs(cm: CostModel, d: int, s: int, form: str) -> np.ndarray:
    """Sequential cost (``form``: ``latency`` or ``energy``) of every cut k = 0..N: nodes [0, k)
    on ``d``, [k, N) on ``s``."""
    n_nodes = cm.n_nodes
    a, alpha, beta = cm.linear(form)
    a = np.where(np.isfinite(cm.node_ms), a, np.inf)
    cost = np.concatenate([[0.0], np.cumsum(a[:, d])]) + np.concatenate(
        [np.cumsum(a[::-1, s])[::-1], [0.0]]
    )
    for f in cm.flows:
        marks = {0, n_nodes + 1}
        if f.src >= 0:
            marks.add(f.src + 1)
        for c in f.dsts:
            marks.update((c, c + 1))
        marks = sorted(m for m in marks if 0 <= m <= n_nodes + 1)
        for lo, hi in zip(marks, marks[1:]):
            k = lo
            src = cm.home if f.src < 0 else (d if f.src < k else s)
            dst = {d if c < k else s for c in f.dsts}
            if f.to_home:
                dst.add(cm.home)
            c_f = sum(alpha[src, q] + f.nbytes * beta[src, q] for q in dst if q != src)
            cost[lo : min(hi, n_nodes + 1)] += c_f
    return cost


def baseline_candidates(
    cm: CostModel, metric: str = "latency", keep_cuts: int = 3
) -> list[Candidate]:
    """The baselines' assignments; ``best-single-cut`` lists its ``keep_cuts`` cheapest cuts
    (by the sequential ``metric``: ``latency`` or ``energy``, see
    :attr:`~edgesplit.optimize.objectives.Objective.baseline_metric`) for the caller to score
    with the schedule."""
    local = [p for p in range(cm.n_procs) if not cm.remote[p]]
    remote = [p for p in range(cm.n_procs) if cm.remote[p]]
    out: list[Candidate] = []
    for p in local:
        ok = _runs_all(cm, p) and feasible(cm, _whole(cm, p), pins=False)
        out.append(
            Candidate(
                f"only:{cm.processors[p]}",
                _whole(cm, p) if ok else None,
                f"all {cm.n_nodes} nodes on {cm.processors[p]}",
            )
        )
    srv = _best_whole(cm, remote)
    if remote:
        name = cm.processors[srv] if srv is not None else "a server processor"
        out.append(
            Candidate(
                "server-only",
                _whole(cm, srv) if srv is not None else None,
                f"all {cm.n_nodes} nodes on {name}",
            )
        )
    dev = _best_whole(cm, local)
    if remote and srv is not None:
        dev_p = dev if dev is not None else cm.home
        cost = cut_costs(cm, dev_p, srv, metric)
        order = [int(k) for k in np.argsort(cost, kind="stable") if np.isfinite(cost[k])]
        kept = 0
        for k in order:
            assign = np.where(np.arange(cm.n_nodes) < k, dev_p, srv).astype(np.int64)
            if not feasible(cm, assign, pins=False):
                continue
            out.append(
                Candidate(
                    "best-single-cut",
                    assign,
                    f"nodes [0, {k}) on {cm.processors[dev_p]}, [{k}, {cm.n_nodes}) on "
                    f"{cm.processors[srv]}",
                )
            )
            kept += 1
            if kept >= keep_cuts:
                break
        if not kept:
            out.append(Candidate("best-single-cut", None, "no cut fits support and memory"))
    order = sorted(
        local,
        key=lambda p: (
            PROVIDER_ORDER.index(cm.kinds[p])
            if cm.kinds[p] in PROVIDER_ORDER
            else len(PROVIDER_ORDER),
            p,
        ),
    )
    supported = np.isfinite(cm.node_ms)
    greedy = np.full(cm.n_nodes, -1, dtype=np.int64)
    for n in range(cm.n_nodes):
        greedy[n] = next((p for p in order if supported[n, p]), -1)
    ok = bool((greedy >= 0).all()) and feasible(cm, greedy, pins=False)
    counts = {cm.processors[p]: int((greedy == p).sum()) for p in order if (greedy == p).any()}
    out.append(
        Candidate(
            "ort-greedy",
            greedy if ok else None,
            ", ".join(f"{k}: {v}" for k, v in counts.items())
            or "no device processor runs every op",
        )
    )
    return out
