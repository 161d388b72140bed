"""``partition --server-load N``: server parts priced under N devices' queueing delay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_pipeline import BOARD, run

import edgesplit
from edgesplit.errors import PlanError
from edgesplit.model import zoo
from edgesplit.optimize.load import ServerLoad, loaded_costs, server_time_ms
from edgesplit.optimize.synthetic import random_costs


@pytest.fixture
def tiny(tmp_path) -> Path:
    return zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")


SLOW = """\
name: slowboard
kind: device
description: a slow board (predicted only), so that a fast server is worth a crowd
processors:
  cpu:
    kind: cpu
    peak_gflops: 0.2
    mem_bandwidth_gbps: 2
    active_w: 3.0
    idle_w: 0.3
    backends:
      - runtime: ort
"""


@pytest.fixture
def board(tmp_path) -> Path:
    p = tmp_path / "pathboard.yaml"
    p.write_text(BOARD)
    return p


@pytest.fixture
def slow(tmp_path) -> Path:
    p = tmp_path / "slowboard.yaml"
    p.write_text(SLOW)
    return p


def test_mva_server_time_is_the_service_time_alone_and_saturates_with_many_devices():
    assert server_time_ms(4.0, 10.0, ServerLoad(1)) == pytest.approx(4.0)
    # one slot, 100 devices, each 4 ms at the server and 10 ms elsewhere: saturated, N S - Z
    assert server_time_ms(4.0, 10.0, ServerLoad(100)) == pytest.approx(100 * 4.0 - 10.0, rel=1e-6)
    # two slots halve the queue: N S / 2 - Z, plus Seidmann's delay S / 2 counted once
    assert server_time_ms(4.0, 10.0, ServerLoad(100, slots=2)) == pytest.approx(
        100 * 2.0 - 12.0 + 2.0, rel=1e-3
    )
    times = [server_time_ms(4.0, 10.0, ServerLoad(n)) for n in (1, 2, 4, 8, 16)]
    assert times == sorted(times) and times[1] > times[0]
    assert server_time_ms(0.0, 10.0, ServerLoad(50)) == 0.0


def test_loaded_costs_scale_only_server_nodes_and_grow_with_the_load():
    cm = random_costs(12, 3, seed=3)
    server = int(np.flatnonzero(cm.remote)[0])

    def solve(costs):  # a stand-in solver: every node the server can run goes there
        assign = np.where(costs.allowed[:, server], server, costs.home)
        return assign, float(costs.node_ms[np.arange(costs.n_nodes), assign].sum())

    factors = [loaded_costs(cm, solve, ServerLoad(n)).factor for n in (1, 8, 64)]
    assert factors[0] == 1.0 and factors == sorted(factors)
    got = loaded_costs(cm, solve, ServerLoad(64))
    local = ~cm.remote
    assert np.array_equal(got.costs.node_ms[:, local], cm.node_ms[:, local])
    np.testing.assert_allclose(
        got.costs.node_ms[:, cm.remote], cm.node_ms[:, cm.remote] * got.factor
    )


def _on_server(plan) -> int:
    return sum(len(p.nodes) for p in plan.parts if p.remote)


def test_the_cut_moves_toward_the_device_as_the_server_gets_crowded(tiny, slow):
    kw = {"server": "server-a100", "bandwidth_mbps": 1000.0, "rtt_ms": 1.0}
    plans = {
        n: edgesplit.partition(tiny, slow, server_load=n, **kw) for n in (1, 16, 64, 256, 4096)
    }
    counts = [_on_server(p) for p in plans.values()]
    assert counts == sorted(counts, reverse=True), counts
    assert counts[0] == 10 and counts[-1] == 0, counts  # alone: all offloaded; crowded: all at home
    assert len(set(counts)) > 2, counts  # and cuts in between
    factors = [p.predicted.server_queue_factor for p in plans.values()]
    assert factors[0] == 1.0 and factors == sorted(factors) and factors[-1] > 10
    assert plans[64].predicted.server_devices == 64
    assert [p.predicted.latency_ms for p in plans.values()] == sorted(
        p.predicted.latency_ms for p in plans.values()
    )
    unloaded = edgesplit.partition(tiny, slow, **kw)
    assert _on_server(unloaded) == counts[0] and unloaded.predicted.server_devices is None


def test_server_load_flags(capsys, tiny, board, tmp_path):
    code, _, err = run(
        capsys,
        "partition",
        str(tiny),
        "-d",
        str(board),
        "--server-load",
        "8",
        "-o",
        str(tmp_path / "a.json"),
    )
    assert code == 2 and "--server-load needs --server" in err
    code, _, err = run(
        capsys,
        "partition",
        str(tiny),
        "-d",
        str(board),
        "--server",
        "server-a100",
        "--bandwidth-mbps",
        "1000",
        "--server-load",
        "64",
        "--server-slots",
        "2",
        "-q",
        "-o",
        str(tmp_path / "b.json"),
    )
    assert code == 0, err
    predicted = json.loads((tmp_path / "b.json").read_text())["predicted"]
    assert predicted["server_devices"] == 64.0 and predicted["server_slots"] == 2.0
    with pytest.raises(PlanError, match="--server-load must be a whole number"):
        edgesplit.partition(tiny, board, server="server-a100", server_load=0)
