"""Exact reduction before search: processors that another processor beats everywhere.

Processor ``q`` is *dominated* by ``p`` when, under every linear form that matters (the objective,
and latency too under an SLO): every node ``q`` may run is allowed on ``p`` and costs no more there;
every crossing between ``p`` and any third processor ``r`` costs no more than the same crossing
with ``q`` (fixed part and per-byte part, both directions); and ``q`` is not the home processor.
Then moving every node from ``q`` to ``p`` never raises the cost: node costs do not grow, each
crossing is replaced by one no dearer, and crossings between ``p`` and ``q`` vanish. So some optimum
avoids ``q`` and the search may drop it. A processor with a node pinned to it is kept. Memory is not
covered by
the argument, so callers skip the reduction where a memory limit could bind.
"""

from __future__ import annotations

import numpy as np

from edgesplit.optimize.costs import CostModel

_TOL = 1e-12


def _dominates(forms, allowed: np.ndarray, pinned: np.ndarray, p: int, q: int, home: int) -> bool:
    if q == home or (pinned & allowed[:, q]).any():
        return False  # the argument moves every node off q; a pinned one cannot move
    movable = allowed[:, q]
    if not movable.any() or not allowed[movable, p].all():
        return False
    others = [r for r in range(allowed.shape[1]) if r not in (p, q)]
    for a, alpha, beta in forms:
        if np.any(a[movable, p] > a[movable, q] + _TOL):
            return False
        for m in (alpha, beta):
            if np.any(m[p, others] > m[q, others] + _TOL) or np.any(
                m[others, p] > m[others, q] + _TOL
            ):
                return False
    return True


def drop_dominated(
    cm: CostModel, forms: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> np.ndarray:
    """``cm.allowed`` without the processors dominated under all ``forms``."""
    allowed = cm.allowed.copy()
    pinned = allowed.sum(axis=1) == 1
    pinned &= np.array([n in cm.pins for n in cm.nodes]) if cm.pins else False
    dropped: set[int] = set()
    for q in range(cm.n_procs):
        for p in range(cm.n_procs):
            if p == q or p in dropped:
                continue
            if _dominates(forms, allowed, pinned, p, q, cm.home):
                allowed[:, q] = False
                dropped.add(q)
                break
    return allowed
