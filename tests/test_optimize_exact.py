"""The exact solvers against brute-force enumeration on random DAGs, and plan invariants."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import max_examples
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from edgesplit.optimize.brute import brute_force, enumerate_costs
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import feasible, sequential_cost
from edgesplit.optimize.exact import Infeasible, is_chain, solve_chain_dp, solve_sequential
from edgesplit.optimize.factor import solve_factored
from edgesplit.optimize.milp import solve_milp
from edgesplit.optimize.parts import part_labels
from edgesplit.optimize.schedule import makespan_lower_bound, schedule, sequential_latency_ms
from edgesplit.optimize.synthetic import random_costs, random_overheads

# max_examples comes from the Hypothesis profile (tests/conftest.py): 100, or 20 with
# --hypothesis-profile=quick
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw, memory: bool | None = None, chain: bool | None = None) -> CostModel:
    """Random DAGs with P ** N <= ~20k: 2-4 processors, random unsupported ops, links and pins."""
    n_procs = draw(st.integers(2, 4))
    max_nodes = {2: 12, 3: 9, 4: 7}[n_procs]
    n_nodes = draw(st.integers(1, max_nodes))
    cm = random_costs(
        n_nodes,
        n_procs,
        draw(st.integers(0, 2**31 - 1)),
        n_remote=draw(st.integers(0, 1)),
        unsupported=draw(st.sampled_from([0.0, 0.2, 0.4])),
        width=draw(st.integers(1, 4)),
        chain=draw(st.booleans()) if chain is None else chain,
        memory=draw(st.booleans()) if memory is None else memory,
    )
    if draw(
        st.booleans()
    ):  # per-part, hand-off and request terms: the sequential forms charge them too
        cm = random_overheads(cm, draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        n = draw(st.integers(0, n_nodes - 1))
        p = draw(st.sampled_from(np.flatnonzero(cm.allowed[n]).tolist()))
        allowed = cm.allowed.copy()
        allowed[n] = False
        allowed[n, p] = True
        cm = replace(cm, allowed=allowed, pins={cm.nodes[n]: cm.processors[p]})
    return cm


def _check(cm: CostModel, objective: str, solver, slo_ms: float | None = None) -> None:
    best_assign, best = brute_force(cm, objective, slo_ms=slo_ms)
    try:
        sol = solver(cm, objective) if slo_ms is None else solver(cm, objective, slo_ms=slo_ms)
    except Infeasible:
        assert best_assign is None, f"solver says infeasible, brute force found {best}"
        return
    assert best_assign is not None, "solver found a plan where brute force found none"
    assert feasible(cm, sol.assign), "the plan breaks support, pins or memory"
    value = sequential_cost(cm, sol.assign, objective)
    assert value == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert sol.value == pytest.approx(best, rel=1e-6, abs=1e-9)
    if slo_ms is not None:
        assert sequential_cost(cm, sol.assign, "latency") <= slo_ms * (1 + 1e-7)


@pytest.mark.parametrize("objective", ["latency", "energy", "mix:0.7"])
@SETTINGS
@given(cm=problems())
def test_solve_sequential_equals_brute_force(cm, objective):
    _check(cm, objective, solve_sequential)


@pytest.mark.parametrize("objective", ["latency", "energy"])
@SETTINGS
@given(cm=problems())
def test_milp_equals_brute_force(cm, objective):
    _check(cm, objective, solve_milp)


@pytest.mark.parametrize("objective", ["latency", "energy"])
@SETTINGS
@given(cm=problems(memory=False))
def test_elimination_equals_brute_force(cm, objective):
    _check(cm, objective, solve_factored)


@SETTINGS
@given(cm=problems(), frac=st.floats(0.0, 1.2))
def test_energy_under_slo_equals_brute_force(cm, frac):
    _, values, ok = enumerate_costs(cm)
    assume(ok.any())  # an SLO needs at least one feasible assignment to sit between
    lat = values["latency"][ok]
    slo = float(lat.min() + frac * (lat.max() - lat.min()))
    _check(cm, "energy", solve_sequential, slo_ms=slo)


@SETTINGS
@given(cm=problems(memory=False, chain=True))
def test_chain_dp_equals_brute_force(cm):
    assert is_chain(cm), "problems(chain=True) must draw chains"
    for objective in ("latency", "energy"):
        _check(cm, objective, lambda c, o: solve_chain_dp(c, o))


@SETTINGS
@given(cm=problems(), data=st.data())
def test_parts_form_an_acyclic_graph(cm, data):
    """Any assignment (and backends) gives connected, single-site parts in a topological order."""
    supported = [np.flatnonzero(np.isfinite(cm.node_ms[n])).tolist() for n in range(cm.n_nodes)]
    assign = np.array([data.draw(st.sampled_from(s)) for s in supported])
    backends = [data.draw(st.sampled_from(["ort", "tvm"])) for _ in range(cm.n_nodes)]
    _check_parts(cm, assign, backends)


def test_parts_of_branchy_models_are_acyclic_and_as_few_as_acyclic_allows():
    """Blocks of parallel branches, scattered over three processors: groups that would wait on each
    other are common here (the random problems above rarely make one), so the cut by phase and
    the merge after it are checked on every assignment."""
    rng = np.random.default_rng(0)
    cut = 0
    for seed in range(30):
        cm = random_costs(40, 3, seed, n_remote=0, unsupported=0.0, blocks=True)
        for _ in range(10):
            assign = rng.integers(0, 3, cm.n_nodes)
            assign[rng.random(cm.n_nodes) < 0.6] = 0  # mostly one processor: long groups to cut
            backends = ["ort"] * cm.n_nodes
            _check_parts(cm, assign, backends)
            cut += len(part_labels(cm, assign, backends)) > len(_groups(cm, assign))
    assert cut >= 20, "too few assignments needed a cut to test it"


def _groups(cm: CostModel, assign: np.ndarray) -> list[set[int]]:
    """Connected groups of nodes on one processor (parts before any cut)."""
    where = list(range(cm.n_nodes))

    def root(a: int) -> int:
        while where[a] != a:
            a = where[a]
        return a

    for a, b in cm.node_edges:
        if assign[a] == assign[b]:
            where[max(root(a), root(b))] = min(root(a), root(b))
    out: dict[int, set[int]] = {}
    for n in range(cm.n_nodes):
        out.setdefault(root(n), set()).add(n)
    return list(out.values())


def _check_parts(cm: CostModel, assign: np.ndarray, backends: list[str]) -> None:
    """Connected, single-site parts in a topological order, and maximal: two parts on one site
    joined by an edge are kept apart only where one part would wait on itself (the later one is
    also reached through a third part)."""
    parts = part_labels(cm, assign, backends)
    where = {n: i for i, part in enumerate(parts) for n in part}
    assert sorted(where) == list(range(cm.n_nodes))
    edges = {(f.src, d) for f in cm.flows if f.src >= 0 for d in f.dsts}
    for a, b in edges:
        assert where[a] <= where[b], "an edge goes back to an earlier part"
    site = [(int(assign[n]), backends[n]) for n in range(cm.n_nodes)]
    for part in parts:
        assert len({site[n] for n in part}) == 1
        inner = {(a, b) for a, b in edges if a in part and b in part}
        seen, stack = {part[0]}, [part[0]]
        while stack:
            u = stack.pop()
            for a, b in inner:
                for v in (b,) if a == u else (a,) if b == u else ():
                    if v not in seen:
                        seen.add(v)
                        stack.append(v)
        assert seen == set(part), "a part is not connected"
    succ: dict[int, set[int]] = {i: set() for i in range(len(parts))}
    for a, b in edges:
        if where[a] != where[b]:
            succ[where[a]].add(where[b])
    for u, vs in succ.items():
        for v in (v for v in vs if site[parts[u][0]] == site[parts[v][0]]):
            stack, seen = [w for w in vs if w != v], set()
            while stack and v not in seen:
                w = stack.pop()
                seen.add(w)
                stack.extend(succ[w] - seen)
            assert v in seen, f"parts {u} and {v} could be one part"


def test_optimize_is_pure():
    """optimize/ never imports onnxruntime, TVM or the runtime (nor does the plan API)."""
    import subprocess
    import sys

    code = (
        "import sys, edgesplit.optimize, edgesplit.optimize.sweep, edgesplit.optimize.plot, "
        "edgesplit.optimize.annotate; bad = [m for m in sys.modules if m.split('.')[0] in "
        "('onnxruntime', 'tvm') or m.startswith('edgesplit.runtime')]; print(bad); "
        "sys.exit(bool(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cycle_of_groups_is_cut():
    """A on p0 feeds B on p1 and C on p0; B feeds C: {A, C} and {B} would wait on each other."""
    cm = random_costs(3, 2, 0, n_remote=0, unsupported=0.0, chain=True)
    from edgesplit.optimize.costs import Flow

    cm = replace(
        cm,
        flows=(
            Flow("x", 10, -1, (0,)),
            Flow("a", 10, 0, (1, 2)),
            Flow("b", 10, 1, (2,)),
            Flow("c", 10, 2, (), True),
        ),
    )
    parts = part_labels(cm, np.array([0, 1, 0]), ["ort"] * 3)
    assert parts == [[0], [1], [2]]


@SETTINGS
@given(cm=problems())
def test_schedule_is_bounded_by_sequential_and_lower_bound(cm):
    assign = np.argmax(cm.allowed, axis=1)
    s = schedule(cm, assign)
    assert s.makespan_ms <= sequential_latency_ms(cm, assign) * (1 + 1e-9) + 1e-9
    if cm.overheads is None:  # nothing per part: the sequential form is the sum of the same terms
        assert s.makespan_ms <= sequential_cost(cm, assign, "latency") * (1 + 1e-9) + 1e-9
        assert s.energy_mj <= sequential_cost(cm, assign, "energy") * (1 + 1e-9) + 1e-9
    _, values, ok = enumerate_costs(cm)
    if ok.any():
        assert makespan_lower_bound(cm) <= s.makespan_ms + 1e-9


@settings(
    max_examples=max_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(cm=problems(memory=False))
def test_brute_force_latency_optimum_bounds_every_schedule(cm):
    """Brute force over the part-level schedule itself: no assignment beats the lower bound, and
    the latency objective's plan is no worse than the best single-processor plan."""
    if cm.n_procs**cm.n_nodes > 600:
        return
    from edgesplit.optimize.solve import solve

    grid, _, ok = enumerate_costs(cm)
    if not ok.any():
        return
    best = min(schedule(cm, a).makespan_ms for a in grid[ok])
    assert makespan_lower_bound(cm) <= best + 1e-9
    out = solve(cm, "latency")
    assert out.schedule.makespan_ms >= best - 1e-9
    whole = [
        schedule(cm, np.full(cm.n_nodes, p)).makespan_ms
        for p in range(cm.n_procs)
        if feasible(cm, np.full(cm.n_nodes, p))
    ]
    if whole:
        assert out.schedule.makespan_ms <= min(whole) * (1 + 1e-9) + 1e-9
