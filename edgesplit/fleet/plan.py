"""The fleet planner: one candidate plan per group, and the server's batching and replicas, chosen
together (the pricing is :mod:`edgesplit.fleet.price`).

The search, for each server setting (replicas from 1 up, and the batching window: the file's
``max_queue_delay_ms``, half of it, and none):

* **Exact** when the choices number at most ``exact_limit`` (the product of the groups'
  candidate counts): every choice is priced.
* Otherwise **coordinate descent** from several starts: every group's best plan alone (what
  Neurosurgeon or DADS would pick for one device), every group on its own device, and every group
  on the most widely offered server part. A sweep tries each candidate of each group with the
  others fixed and keeps the best fleet score; sweeps repeat until none improves. Then a
  *consolidation* move tries every server part for all the groups that offer it at once (moves
  one group at a time cannot find: two groups that batch well together but not apart), and the
  descent runs again after any that improves.

The setting kept is the fewest replicas that meet every deadline (else the one with the smallest
total miss), and at those replicas the batching window with the best score (ties: the shorter).
A server that saturates prices its requests at an infinite p95, so the search moves groups back
onto their devices; where that cannot meet the deadlines, a replica more is tried.

A group whose deadline no choice meets stays in the plan with its best effort, and is named in
:attr:`FleetChoice.unmet`: never dropped.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypedDict, Unpack

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.fleet.price import _FIELDS, FleetTable, Group, Pricing, Server, best_row

EXACT_LIMIT = 4096
MAX_ROUNDS = 200


class SearchOptions(TypedDict, total=False):
    """How :func:`plan_fleet` searches (every key optional)."""

    exact_limit: int
    """Price every choice when there are at most this many (default :data:`EXACT_LIMIT`); 0:
    always the coordinate descent."""
    max_replicas: int
    """Server replicas to try at most (default 1)."""
    windows: bool
    """Try shorter batching windows than the server's (default True)."""


@dataclass(frozen=True)
class FleetChoice:
    """What :func:`plan_fleet` chose.

    Attributes:
        pricing: The choice (a candidate index per group) and its figures.
        server: The server setting it is priced on (replicas and batching window chosen).
        search: ``exact`` or ``descent``; ``evaluations``: choices priced; ``time_s``.
        energy_bound_mj: A lower bound of the fleet's device energy a second (each energy group's
            cheapest candidate that meets its deadline alone): the descent's gap is measured to it.
        unmet: Groups whose predicted p95 is over their deadline.
        settings: Every server setting tried: (replicas, window ms, score).
    """

    pricing: Pricing
    server: Server
    search: str
    evaluations: int
    time_s: float
    energy_bound_mj: float
    unmet: tuple[str, ...]
    settings: tuple[tuple[int, float, tuple[float, float, float]], ...]


def alone_ms(group: Group, i: int) -> float:
    """Candidate ``i``'s latency alone: no queue, no batch."""
    c = group.candidates[i]
    return c.device_ms + c.server_ms


def best_alone(group: Group, device_only: bool = False) -> int:
    """The candidate a group would pick alone: the cheapest (by its objective) that meets its
    deadline, else the fastest; ``device_only``: among those without a server part (if any)."""
    idx = [i for i, c in enumerate(group.candidates) if not device_only or c.key is None]
    idx = idx or list(range(len(group.candidates)))
    ok = [i for i in idx if alone_ms(group, i) <= group.deadline_p95_ms]
    if not ok:
        return min(idx, key=lambda i: alone_ms(group, i))
    if not group.minimises_energy:
        return min(ok, key=lambda i: alone_ms(group, i))
    return min(ok, key=lambda i: (group.candidates[i].energy_mj, alone_ms(group, i)))


class _Search:
    """Coordinate descent over one table and server setting; a group's candidates are priced at
    once, a row each."""

    def __init__(self, table: FleetTable, server: Server):
        self.t, self.s, self.evaluations = table, server, 0

    def scores(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        self.evaluations += arrays[0].shape[0]
        return self.t.score_rows(arrays, self.s)[0]

    def descent(self, choice: list[int]) -> tuple[list[int], tuple]:
        """Improve ``choice`` until no single group's move helps. Each round prices every single
        move at once, then the moves that help, best first (one per group), applied in turn:
        the best of those prefixes is taken (at least the best single move)."""
        t = self.t
        state = [a[None, :] for a in t.arrays(choice)]
        best = tuple(self.scores(state)[0])
        mg = np.array([g for g, c in enumerate(t.cand) for _ in range(len(c["key"]))])
        mi = np.array([i for c in t.cand for i in range(len(c["key"]))])
        for _ in range(MAX_ROUNDS):
            keep = mi != np.asarray(choice)[mg]
            g_of, i_of = mg[keep], mi[keep]
            if not len(g_of):
                break
            sc = self.scores(_moved(t, state, g_of, i_of))
            order = np.lexsort((sc[:, 2], sc[:, 1], sc[:, 0]))
            seen, picked = set(), []
            for k in order:
                if not tuple(sc[k]) < best:
                    break
                if g_of[k] not in seen:
                    seen.add(g_of[k])
                    picked.append(k)
            if not picked:
                break
            rows = _moved_prefix(t, state, g_of[picked], i_of[picked])
            sc2 = self.scores(rows)
            j = best_row(sc2)
            if not tuple(sc2[j]) < best:
                break
            best = tuple(sc2[j])
            for k in picked[: j + 1]:
                choice[g_of[k]] = int(i_of[k])
            state = [a[j : j + 1].copy() for a in rows]
        return choice, best

    def consolidate(self, choice: list[int], best: tuple) -> tuple[list[int], tuple, bool]:
        """Each server part for every group that offers it at once; the best that improves."""
        news = []
        for k in range(len(self.t.keys)):
            new = list(choice)
            for g, cand in enumerate(self.t.cand):
                hits = np.flatnonzero(cand["key"] == k)
                if hits.size:
                    new[g] = int(hits[0])
            if new != choice:
                news.append(new)
        if not news:
            return choice, best, False
        rows = [np.stack(a) for a in zip(*(self.t.arrays(n) for n in news))]
        sc = self.scores(rows)
        i = best_row(sc)
        if tuple(sc[i]) < best:
            return news[i], tuple(sc[i]), True
        return choice, best, False

    def run(self, starts: Sequence[list[int]]) -> tuple[list[int], tuple]:
        results = []
        for start in starts:
            choice, best = self.descent(list(start))
            for _ in range(len(self.t.keys) + 1):
                choice, best, better = self.consolidate(choice, best)
                if not better:
                    break
                choice, best = self.descent(choice)
            results.append((best, choice))
        best, choice = min(results, key=lambda r: r[0])
        return choice, best


def _values(t: FleetTable, groups: np.ndarray, cands: np.ndarray) -> list[np.ndarray]:
    return [np.array([t.cand[g][f][i] for g, i in zip(groups, cands)]) for f in _FIELDS]


def _moved(t: FleetTable, state, groups: np.ndarray, cands: np.ndarray) -> list[np.ndarray]:
    """``state`` (one row) repeated, row ``r`` with group ``groups[r]`` on candidate
    ``cands[r]``."""
    out = [np.repeat(a, len(groups), axis=0) for a in state]
    rows = np.arange(len(groups))
    for a, v in zip(out, _values(t, groups, cands)):
        a[rows, groups] = v
    return out


def _moved_prefix(t: FleetTable, state, groups: np.ndarray, cands: np.ndarray) -> list:
    """``state`` repeated, row ``r`` with the first ``r + 1`` moves applied."""
    n = len(groups)
    out = [np.repeat(a, n, axis=0) for a in state]
    r, k = np.nonzero(np.tril(np.ones((n, n), dtype=bool)))
    for a, v in zip(out, _values(t, groups, cands)):
        a[r, groups[k]] = v[k]
    return out


def _starts(groups: Sequence[Group]) -> list[list[int]]:
    alone = [best_alone(g) for g in groups]
    device = [best_alone(g, device_only=True) for g in groups]
    offered = Counter(c.key for g in groups for c in {c.key: c for c in g.candidates}.values())
    offered.pop(None, None)
    starts = [alone, device]
    if offered:
        key = offered.most_common(1)[0][0]
        shared = [
            next((i for i, c in enumerate(g.candidates) if c.key == key), a)
            for g, a in zip(groups, alone)
        ]
        starts.append(shared)
    return starts


def _exact(table: FleetTable, server: Server) -> tuple[list[int], tuple, int]:
    """Every choice priced, a block of rows at a time; the best (first of equals)."""
    combos = itertools.product(*(range(len(g.candidates)) for g in table.groups))
    best, choice, n = None, None, 0
    while block := list(itertools.islice(combos, 1024)):
        n += len(block)
        idx = np.array(block)
        rows = [
            np.stack([table.cand[g][f][idx[:, g]] for g in range(idx.shape[1])], axis=1)
            for f in _FIELDS
        ]
        sc = table.score_rows(rows, server)[0]
        i = best_row(sc)
        if best is None or tuple(sc[i]) < best:
            best, choice = tuple(sc[i]), [int(v) for v in idx[i]]
    return choice, best, n


def _n_choices(groups: Sequence[Group]) -> float:
    return math.prod(float(len(g.candidates)) for g in groups)


def _windows(server: Server, try_shorter: bool) -> list[float]:
    if server.max_batch <= 1 or server.max_queue_delay_ms <= 0:
        return [0.0]
    w = server.max_queue_delay_ms
    return sorted({0.0, w / 2, w}) if try_shorter else [w]


def check_groups(groups: Sequence[Group], server: Server) -> None:
    """Refuse what cannot be planned: no group, a group without candidates, a bad server."""
    if not groups:
        raise PlanError("the fleet has no groups")
    empty = [g.name for g in groups if not g.candidates]
    if empty:
        raise PlanError(f"groups without a candidate plan: {', '.join(empty)}")
    if server.slots < 1 or server.max_batch < 1 or server.replicas < 1:
        raise PlanError("the server needs at least 1 slot, a batch of 1 and 1 replica")


def energy_bound_mj(groups: Sequence[Group]) -> float:
    """Each energy group's cheapest candidate that meets its deadline alone, times its requests a
    second: no choice of the fleet's costs less (the load only adds time and idle energy)."""
    total = 0.0
    for g in groups:
        if not g.minimises_energy:
            continue
        ok = [
            c.energy_mj for i, c in enumerate(g.candidates) if alone_ms(g, i) <= g.deadline_p95_ms
        ]
        total += g.requests_per_s * min(ok or [c.energy_mj for c in g.candidates])
    return total


def plan_fleet(
    groups: Sequence[Group], server: Server, **options: Unpack[SearchOptions]
) -> FleetChoice:
    """Choose a candidate per group and the server's setting (see the module doc).

    Raises:
        PlanError: no groups, a group without candidates, a server without a slot.
    """
    check_groups(groups, server)
    t0 = time.perf_counter()
    exact_limit = options.get("exact_limit", EXACT_LIMIT)
    table = FleetTable(groups, server)
    exact = _n_choices(groups) <= exact_limit
    starts = _starts(groups)
    tried, evaluations, best = [], 0, None
    alone = starts[0]
    for replicas in range(1, max(1, options.get("max_replicas", 1)) + 1):
        at_r = None
        for window in _windows(server, options.get("windows", True)):
            s = replace(server, replicas=replicas, max_queue_delay_ms=window)
            if exact:
                choice, score, n = _exact(table, s)
            else:
                search = _Search(table, s)
                choice, score = search.run(starts)
                n = search.evaluations
            evaluations += n
            tried.append((replicas, window, score))
            if at_r is None or score < at_r[0]:
                at_r = (score, choice, s)
            starts = [list(choice), alone]  # the next setting starts from this one's best
        if best is None or at_r[0] < best[0]:
            best = at_r
        if best[0][0] == 0.0:  # every deadline met: no replica more
            break
    score, choice, s = best
    pricing = table.price(choice, s)
    unmet = tuple(
        g.name for g, p95 in zip(groups, pricing.p95_ms) if p95 > g.deadline_p95_ms * (1 + 1e-9)
    )
    return FleetChoice(
        pricing=pricing,
        server=s,
        search="exact" if exact else "descent",
        evaluations=evaluations,
        time_s=time.perf_counter() - t0,
        energy_bound_mj=energy_bound_mj(groups),
        unmet=unmet,
        settings=tuple(tried),
    )
