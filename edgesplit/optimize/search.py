"""Bounded local search on an assignment, for objectives no exact solver covers (makespan, period).

Hill climbing with first improvement over two kinds of move, in a fixed order so the result is
deterministic: move a whole group (connected nodes on one processor) to another processor, move a
chain segment (a branch of a block) to another processor, and move a node that borders another
processor to a processor of a neighbour or to any allowed one. It
stops at a local optimum or after ``max_evals`` evaluations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import feasible, memory_binding
from edgesplit.optimize.parts import part_labels

Score = Callable[[np.ndarray], float]


def neighbours(cm: CostModel) -> list[list[int]]:
    """Undirected data neighbours of every node."""
    adj: list[set[int]] = [set() for _ in range(cm.n_nodes)]
    for f in cm.flows:
        ends = ([f.src] if f.src >= 0 else []) + list(f.dsts)
        for a in ends:
            adj[a].update(b for b in ends if b != a)
    return [sorted(s) for s in adj]


def groups(assign: np.ndarray, adj: list[list[int]]) -> list[list[int]]:
    """Connected groups of nodes on the same processor."""
    seen = np.zeros(len(assign), dtype=bool)
    out = []
    for n in range(len(assign)):
        if seen[n]:
            continue
        stack, comp = [n], []
        seen[n] = True
        while stack:
            u = stack.pop()
            comp.append(u)
            for v in adj[u]:
                if not seen[v] and assign[v] == assign[u]:
                    seen[v] = True
                    stack.append(v)
        out.append(sorted(comp))
    return out


def local_search(
    cm: CostModel,
    starts: Iterable[np.ndarray],
    score: Score,
    *,
    max_evals: int = 300,
    visited: list[tuple[float, np.ndarray]] | None = None,
) -> tuple[np.ndarray, float, int]:
    """Best assignment found from ``starts`` by hill climbing on ``score``; also its score and
    the number of evaluations spent. ``visited``, when given, receives every ``(score,
    assignment)`` evaluated (for :func:`fewest_parts`)."""
    check_memory = memory_binding(cm)
    adj = neighbours(cm)
    segs = segments(cm)
    best, best_v, evals = None, np.inf, 0
    seen: set[bytes] = set()
    candidates = []
    for s in starts:
        s = np.asarray(s, dtype=np.int64)
        key = s.tobytes()
        if key in seen or not feasible(cm, s):
            continue
        seen.add(key)
        candidates.append((score(s), s))
        evals += 1
        if visited is not None:
            visited.append(candidates[-1])
    if not candidates:
        raise ValueError("no feasible start")
    candidates.sort(key=lambda t: t[0])
    best_v, best = candidates[0]
    cur, cur_v = best.copy(), best_v

    def ok(a: np.ndarray) -> bool:
        return not check_memory or feasible(cm, a)

    improved = True
    while improved and evals < max_evals:
        improved = False
        for move in _moves(cm, cur, adj, segs):
            if evals >= max_evals:
                break
            trial = cur.copy()
            for n, p in move:
                trial[n] = p
            key = trial.tobytes()
            if key in seen or not ok(trial):
                continue
            seen.add(key)
            v = score(trial)
            evals += 1
            if visited is not None:
                visited.append((v, trial))
            if v < cur_v - 1e-9:
                cur, cur_v = trial, v
                improved = True
                break
    if cur_v < best_v:
        best, best_v = cur, cur_v
    return best, float(best_v), evals


def segments(cm: CostModel) -> list[list[int]]:
    """Maximal chains (each node the only reader of the previous one's only output): the branches
    of residual and inception blocks, moved as a whole to find work that can overlap."""
    preds: list[set[int]] = [set() for _ in range(cm.n_nodes)]
    succs: list[set[int]] = [set() for _ in range(cm.n_nodes)]
    for f in cm.flows:
        if f.src >= 0:
            for d in f.dsts:
                preds[d].add(f.src)
                succs[f.src].add(d)
    out, seen = [], set()
    for n in range(cm.n_nodes):
        if n in seen:
            continue
        chain = [n]
        while len(succs[chain[-1]]) == 1:
            nxt = next(iter(succs[chain[-1]]))
            if len(preds[nxt]) != 1 or nxt in seen:
                break
            chain.append(nxt)
        seen.update(chain)
        if len(chain) >= 2:
            out.append(chain)
    return out


def _moves(cm: CostModel, assign: np.ndarray, adj: list[list[int]], segs: list[list[int]]):
    allowed = cm.allowed
    for comp in sorted(groups(assign, adj), key=len, reverse=True):
        here = assign[comp[0]]
        for p in range(cm.n_procs):
            if p != here and allowed[comp, p].all():
                yield [(n, p) for n in comp]
    for seg in segs:
        for p in range(cm.n_procs):
            if allowed[seg, p].all() and (assign[seg] != p).any():
                yield [(n, p) for n in seg]
    for n in range(cm.n_nodes):
        near = {int(assign[m]) for m in adj[n]} - {int(assign[n])}
        if not near:
            continue
        for p in sorted(near) + [p for p in range(cm.n_procs) if p not in near]:
            if p != assign[n] and allowed[n, p]:
                yield [(n, p)]


def n_parts(cm: CostModel, assign: np.ndarray) -> int:
    """How many parts the runtime would run for ``assign``."""
    return len(part_labels(cm, np.asarray(assign)))


def fewest_parts(
    cm: CostModel, visited: list[tuple[float, np.ndarray]], noise_rel: float
) -> tuple[np.ndarray, float, int]:
    """Of the assignments scored within ``noise_rel`` of the best, the one with the fewest parts
    (then the lowest score): where measurement cannot tell plans apart, the simpler one is kept
    (it has fewer boundaries whose costs the model may miss, and a single processor has none).
    Returns it, its score and its number of parts."""
    best = min(v for v, _ in visited)
    limit = best * (1.0 + noise_rel) + 1e-12
    within = [(n_parts(cm, a), v, i) for i, (v, a) in enumerate(visited) if v <= limit]
    count, value, i = min(within)
    return visited[i][1], value, count
