"""Parts: maximal connected groups of nodes on one (processor, backend), in an acyclic order.

Connected groups can form a cycle (A on the CPU feeds B on the GPU, which feeds C on the CPU, while
A also feeds C directly: {A, C} and {B} wait on each other). Then the groups are cut by *phase*,
the most processor changes on any path from the inputs to the node; every edge between two parts
then goes to a higher phase, so the part graph is acyclic. Cut parts on the same processor are
merged back wherever that closes no cycle (an edge u -> v merges when v is not reachable from u
any other way). Splitting or merging parts on one processor moves no tensor, so costs are equal.

Every assignment goes through the cut and the merge, cycle or not: where the connected groups form
no cycle, the merge gives them back exactly (two pieces of one group could only be kept apart by a
path that leaves the group and comes back, which would be a cycle), and most assignments a local
search tries have one (81% of googlenet's, 91% of the transformer's), so finding the groups first
to look for a cycle cost more than it saved (the same parts for 18,000 random assignments and for
every one of the 6,648 that searches on googlenet and the transformer tried; 15-20% faster).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgesplit.optimize.costs import CostModel


def _components(n: int, edges: Sequence[tuple[int, int]], key: Sequence) -> list[int]:
    """Connected components of the edges ``(a, b)``, ``a < b``, whose ends have equal ``key``:
    per node, its component's first node (so labels sort as the components' first nodes do).

    Hot (the local search makes the parts of hundreds of assignments per plan): union by the
    smaller root keeps ``parent[i] <= i``, so one pass in node order resolves every root, and a
    component's root is its first node."""
    parent = list(range(n))
    for a, b in edges:
        if key[a] != key[b]:
            continue
        while parent[a] != a:  # path halving keeps parent[i] <= i
            parent[a] = parent[parent[a]]
            a = parent[a]
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        if a < b:
            parent[b] = a
        elif b < a:
            parent[a] = b
    for i in range(n):
        parent[i] = parent[parent[i]]
    return parent


def _part_graph(label: Sequence[int], edges: Sequence[tuple[int, int]]) -> dict[int, set[int]]:
    succ: dict[int, set[int]] = {lab: set() for lab in dict.fromkeys(label)}  # one set per part
    for a, b in edges:
        la, lb = label[a], label[b]
        if la != lb:
            succ[la].add(lb)
    return succ


def _first_nodes(label: Sequence[int]) -> dict[int, int]:
    first: dict[int, int] = {}
    for i, lab in enumerate(label):
        first.setdefault(lab, i)
    return first


def _topo(succ: dict[int, set[int]], first_node: dict[int, int]) -> list[int] | None:
    """A topological order of the part graph (ties by first node), or None when it has a cycle."""
    import heapq

    indeg = dict.fromkeys(succ, 0)
    for vs in succ.values():
        for v in vs:
            indeg[v] += 1
    heap = [(first_node[u], u) for u, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, u = heapq.heappop(heap)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (first_node[v], v))
    return order if len(order) == len(succ) else None


def _reaches(succ: dict[int, set[int]], u: int, v: int, skip_direct: bool) -> bool:
    stack = [w for w in succ[u] if not (skip_direct and w == v)]
    seen = set(stack)
    while stack:
        w = stack.pop()
        if w == v:
            return True
        for z in succ[w]:
            if z not in seen:
                seen.add(z)
                stack.append(z)
    return False


def part_labels(
    cm: CostModel, assign: np.ndarray, backends: Sequence[str | None] | None = None
) -> list[list[int]]:
    """The parts of an assignment as lists of node indices, in a topological order of parts.
    ``backends``: each node's backend (by default, the cost model's on the node's processor)."""
    n = cm.n_nodes
    if n == 0:
        return []
    x = np.asarray(assign)
    if backends is None:
        site = cm.site_codes[np.arange(n), x].tolist()
    else:
        codes: dict[tuple, int] = {}
        site = [codes.setdefault(s, len(codes)) for s in zip(x.tolist(), backends)]
    edges = cm.node_edges
    # split operators: a piece, and a join, never share a part with other nodes before them
    joined = _apart(cm, edges) if cm.piece_of or cm.joins else edges
    label = _merge(_components(n, joined, _phase_keys(cm, site)), edges, site, _fixed(cm))
    order = _topo(_part_graph(label, edges), _first_nodes(label))
    assert order is not None, "parts must form an acyclic graph"
    members: dict[int, list[int]] = {lab: [] for lab in order}
    for i, lab in enumerate(label):
        members[lab].append(i)
    return [members[lab] for lab in order]


def _phase_keys(cm: CostModel, site: list[int]) -> list[int]:
    """Per node, its site and phase as one key: the phase is the most site changes on any path from
    the inputs to the node (nodes are in a topological order)."""
    n = cm.n_nodes
    phase = [0] * n
    for i, preds in enumerate(cm.node_preds):
        if not preds:
            continue
        s = site[i]
        if len(preds) == 1:  # most nodes
            m = preds[0]
            phase[i] = phase[m] + (site[m] != s)
        else:
            phase[i] = max([phase[m] + (site[m] != s) for m in preds])
    return [s * (n + 1) + f for s, f in zip(site, phase)]


def _apart(cm: CostModel, edges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The edges within one piece, or between nodes in none that do not end at a join: the only
    ones along which nodes of one site join into a part (see
    :func:`edgesplit.model.pieces.piece_layout`)."""
    piece = cm.piece_of or (-1,) * cm.n_nodes
    return tuple((a, b) for a, b in edges if piece[a] == piece[b] and b not in cm.joins)


def _fixed(cm: CostModel) -> frozenset[int]:
    """Nodes whose parts are never merged with another (a piece's nodes, a join)."""
    return frozenset(i for i, k in enumerate(cm.piece_of) if k >= 0) | cm.joins


def _merge(
    label: list[int],
    edges: Sequence[tuple[int, int]],
    site: list,
    fixed: frozenset[int] = frozenset(),
) -> list[int]:
    """Merge parts on one site along an edge ``u -> v`` wherever ``v`` is not reachable from ``u``
    any other way, smallest ``u`` and ``v`` first, until none is left; never a part that begins at
    a node of ``fixed``. The part graph is updated in place at each merge (the same graph a
    recomputation would give)."""
    succ = _part_graph(label, edges)
    pred: dict[int, set[int]] = {u: set() for u in succ}
    for u, vs in succ.items():
        for v in vs:
            pred[v].add(u)
    site_of = {label[i]: site[i] for i in range(len(label))}
    into: dict[int, int] = {}
    changed = True
    while changed:
        changed = False
        for u in sorted(succ):
            for v in sorted(succ[u]):
                if (
                    site_of[u] == site_of[v]
                    and not ({u, v} & fixed)
                    and not _reaches(succ, u, v, skip_direct=True)
                ):
                    _absorb(succ, pred, u, v)
                    into[v] = u
                    changed = True
                    break
            if changed:
                break
    final = {}
    for lab in set(label):
        r = lab
        while r in into:
            r = into[r]
        final[lab] = r
    return [final[v] for v in label]


def _absorb(succ: dict[int, set[int]], pred: dict[int, set[int]], u: int, v: int) -> None:
    """Part ``v`` becomes part of ``u`` (``u -> v`` is an edge of the part graph)."""
    for w in succ.pop(v):
        pred[w].discard(v)
        if w != u:
            succ[u].add(w)
            pred[w].add(u)
    for w in pred.pop(v):
        succ[w].discard(v)
        if w != u:
            succ[w].add(u)
            pred[u].add(w)
    succ[u].discard(v)
