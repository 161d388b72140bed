"""The band table (the best plan for every bandwidth) against brute force over a fine grid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesplit.errors import PlanError
from edgesplit.optimize.bands import band_table, curves, link_rates, with_rate
from edgesplit.optimize.brute import enumerate_costs
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import sequential_cost
from edgesplit.optimize.schedule import schedule
from edgesplit.optimize.synthetic import random_costs

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
GRID = np.logspace(-1, 3, 161)  # 40 points a decade, 0.1 to 1000 Mbit/s


@st.composite
def networked(draw) -> CostModel:
    """Random small DAGs with a server over a network link (P ** N <= ~2k)."""
    n_procs = draw(st.integers(2, 3))
    n_nodes = draw(st.integers(1, {2: 9, 3: 6}[n_procs]))
    return random_costs(
        n_nodes,
        n_procs,
        draw(st.integers(0, 2**31 - 1)),
        n_remote=1,
        unsupported=draw(st.sampled_from([0.0, 0.3])),
        chain=draw(st.booleans()),
        memory=draw(st.booleans()),
    )


def _brute(cm: CostModel, form: str) -> tuple[np.ndarray, np.ndarray]:
    """Every feasible assignment and its ``form`` value."""
    grid, values, ok = enumerate_costs(cm)
    return grid[ok], values[form][ok]


@pytest.mark.slow  # 161 brute-force solves per example: 6 s with the quick profile's 20 examples
@SETTINGS
@given(networked(), st.sampled_from(["latency_sequential", "energy"]))
def test_band_table_is_optimal_on_a_fine_grid(cm: CostModel, name: str) -> None:
    form = "latency" if name == "latency_sequential" else "energy"
    table = band_table(cm, name, per_decade=2)
    assert table.bands[0].lo_mbps == 0.1 and table.bands[-1].hi_mbps == 1000.0
    for a, b in zip(table.bands, table.bands[1:]):
        assert a.hi_mbps == b.lo_mbps and a.plan != b.plan
    for bw in GRID:
        m = with_rate(cm, float(bw))
        _, values = _brute(m, form)
        best = float(values.min())
        plan = table.plan_at(float(bw))
        # energy plans are refined on the schedule's energy, never above the sequential figure
        got = schedule(m, plan).energy_mj if form == "energy" else sequential_cost(m, plan, form)
        assert got <= best + 1e-7 * max(1.0, abs(best)), (
            f"{bw:.4g} Mbit/s: table {got} > optimum {best}"
        )


@pytest.mark.slow
@SETTINGS
@given(networked())
def test_breakpoints_are_exact(cm: CostModel) -> None:
    """At a breakpoint the plans of the two bands cost the same, and each is optimal on its side."""
    table = band_table(cm, "latency_sequential", per_decade=2, rel_tol=1e-9)
    for left, right in zip(table.bands, table.bands[1:]):
        x = right.lo_mbps
        a, b = table.assigns[left.plan], table.assigns[right.plan]
        at = with_rate(cm, x)
        va, vb = sequential_cost(at, a, "latency"), sequential_cost(at, b, "latency")
        assert math.isclose(va, vb, rel_tol=1e-6), (x, va, vb)
        for side, plan in ((x * (1 - 1e-4), a), (x * (1 + 1e-4), b)):
            m = with_rate(cm, side)
            best = float(_brute(m, "latency")[1].min())
            assert sequential_cost(m, plan, "latency") <= best * (1 + 1e-9) + 1e-9


def test_the_cut_moves_toward_the_device_as_bandwidth_falls() -> None:
    cm = random_costs(8, 2, 3, n_remote=1, chain=True, unsupported=0.0)
    table = band_table(cm, "latency_sequential")
    remote_nodes = [int(cm.remote[a].sum()) for a in (table.plan_at(float(b)) for b in GRID)]
    assert remote_nodes == sorted(remote_nodes)  # more bandwidth, never less offloaded
    assert remote_nodes[0] == 0  # at 0.1 Mbit/s nothing crosses the network
    values = curves(cm, "latency_sequential", table.assigns, [0.1, 1000.0])
    assert len(values) == len(table.assigns) and all(len(v) == 2 for v in values)


def test_with_rate_scales_the_downlink_alike() -> None:
    cm = random_costs(4, 2, 5, n_remote=1)
    up, down = link_rates(cm)
    up2, down2 = link_rates(with_rate(cm, up / 4))
    assert math.isclose(up2, up / 4) and math.isclose(down2, down / 4)


def test_no_server_or_bad_range_is_refused() -> None:
    with pytest.raises(PlanError, match="no server"):
        band_table(random_costs(4, 2, 1, n_remote=0))
    with pytest.raises(PlanError, match="0 < lo < hi"):
        band_table(random_costs(4, 2, 1), lo_mbps=10, hi_mbps=1)
