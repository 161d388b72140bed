"""Plans for zoo models on the Snapdragon 8 Gen 2 plus an A100 server, with predicted profiles."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edgesplit.device.spec import DeviceSpec, load_device, network_link
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.optimize.evaluate import violations
from edgesplit.workflows.resolve import partition

# Plans for real zoo models on the Snapdragon spec: seconds each (the solvers' property tests,
# tests/test_optimize_exact.py, are in the quick subset).
pytestmark = pytest.mark.slow

BANDWIDTHS = (1, 3, 10, 30, 100, 300, 1000)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    return {
        name: load_model(zoo.save(name, d / f"{name}.onnx"))
        for name in ("resnet18", "googlenet", "transformer", "chain_shrink")
    }


@pytest.fixture(scope="module")
def snapdragon():
    return load_device("snapdragon-8gen2"), load_device("server-a100")


def _plans(graph, device, server, **kw):
    return {
        bw: partition(
            graph, device, server=server, link=network_link("wifi", bandwidth_mbps=bw, **kw)
        )
        for bw in BANDWIDTHS
    }


@pytest.fixture(scope="module")
def snapdragon_plans(graphs, snapdragon):
    """A model's plans at every bandwidth on the Snapdragon with the A100, made once per model (the
    transformer's take minutes, and two tests read them)."""
    made = {}

    def plans(name: str) -> dict:
        if name not in made:
            made[name] = _plans(graphs[name], *snapdragon)
        return made[name]

    return plans


@pytest.mark.parametrize("name", ["resnet18", "googlenet", "transformer"])
def test_plan_never_worse_than_any_baseline(graphs, snapdragon_plans, name):
    plans = snapdragon_plans(name)
    for bw, plan in plans.items():
        feasible = [b for b in plan.baselines if b.feasible]
        assert {b.name for b in feasible} >= {"server-only", "best-single-cut", "ort-greedy"}
        for b in feasible:
            assert plan.predicted.latency_ms <= b.latency_ms * (1 + 1e-9), (bw, b)
        assert sorted(plan.assignment) == sorted(n.name for n in graphs[name].nodes)


def test_branchy_transformer_beats_the_best_single_cut(snapdragon_plans):
    """The encoder's ops that the NPU lacks rule out NPU-only; mixing CPU and GPU beats any cut."""
    plans = snapdragon_plans("transformer")
    wins = [
        bw
        for bw, p in plans.items()
        if p.predicted.latency_ms < p.baseline("best-single-cut").latency_ms - 1e-6
    ]
    assert wins, "the plan never strictly beats the best single cut"


def test_googlenet_parts_never_start_before_the_parts_they_read(graphs):
    """The plan is priced as the runtime runs it: a part starts only after every part it reads from
    has ended (its outputs are released at its end), so an inception branch cannot overlap the part
    that makes its input. On the Jetson, where node-level interleaving once looked like a win over
    the best single cut, no plan beats the best baseline and the plan is no worse than any."""
    plans = _plans(graphs["googlenet"], load_device("jetson-orin-nano"), load_device("server-a100"))
    for plan in plans.values():
        ends = {p.name: p.end_ms for p in plan.parts}
        for t in plan.transfers:
            if t.src_part in ends and t.dst_part in ends:
                start = next(p.start_ms for p in plan.parts if p.name == t.dst_part)
                assert start >= ends[t.src_part] - 1e-9, t
        best = min(b.latency_ms for b in plan.baselines if b.feasible)
        assert plan.predicted.latency_ms <= best * (1 + 1e-9)


def test_plans_respect_support_pins_and_parts(graphs, snapdragon):
    device, server = snapdragon
    graph = graphs["googlenet"]
    pin = graph.nodes[5].name
    plan = partition(
        graph,
        device,
        server=server,
        link=network_link("wifi", bandwidth_mbps=50),
        pins={pin: "gpu"},
    )
    assert plan.assignment[pin]["processor"] == "gpu"
    seen = set()
    for part in plan.parts:
        assert {plan.assignment[n]["processor"] for n in part.nodes} == {part.processor}
        seen.update(part.nodes)
    assert seen == set(plan.assignment)
    order = {p.name: i for i, p in enumerate(plan.parts)}
    for t in plan.transfers:
        if t.src_part != "input" and t.dst_part != "output":
            assert order[t.src_part] < order[t.dst_part]


def _slow_device() -> DeviceSpec:
    """One slow CPU core (an IoT board): where offloading pays, as in Neurosurgeon."""
    pi = load_device("raspberry-pi5")
    cpu = replace(pi.processors[0], peak_gflops=40.0, mem_bandwidth_gbps=8.0)
    return replace(pi, name="slow-cpu", processors=(cpu,), path="")


def test_chain_cut_moves_toward_the_input_as_bandwidth_grows(graphs):
    graph = graphs["chain_shrink"]
    assert graph.is_chain()
    device, server = _slow_device(), load_device("server-a100")
    cuts = []
    for bw in np.logspace(0, 3, 13):
        plan = partition(
            graph,
            device,
            server=server,
            link=network_link("wifi", bandwidth_mbps=float(bw), rtt_ms=1),
        )
        on_device = [
            n.name
            for n in graph.nodes
            if not plan.assignment[n.name]["processor"].startswith("server")
        ]
        assert on_device == [n.name for n in graph.nodes[: len(on_device)]], "not a prefix"
        cuts.append(len(on_device))
    assert cuts == sorted(cuts, reverse=True), cuts
    assert cuts[0] == len(graph.nodes) and cuts[-1] < len(graph.nodes)
    assert len(set(cuts)) >= 3, f"the cut should pass through the middle of the chain: {cuts}"


@pytest.mark.parametrize("objective", ["energy", "throughput", "pareto", "latency_sequential"])
def test_other_objectives(graphs, snapdragon, objective):
    device, server = snapdragon
    graph = graphs["resnet18"]
    plan = partition(
        graph,
        device,
        server=server,
        link=network_link("wifi", bandwidth_mbps=100),
        objective=objective,
    )
    assert plan.objective == objective
    assert plan.predicted.throughput_per_s > 0
    if objective == "pareto":
        assert plan.pareto and sum(p["chosen"] for p in plan.pareto) == 1
        lat = [p["latency_ms"] for p in plan.pareto]
        en = [p["energy_mj"] for p in plan.pareto]
        assert lat == sorted(lat) and en == sorted(en, reverse=True)
    if objective == "throughput":
        for b in plan.baselines:
            if b.feasible:
                assert plan.predicted.throughput_per_s >= b.throughput_per_s * (1 - 1e-9)
    if objective == "energy":
        for b in plan.baselines:
            if b.feasible and b.name.startswith("only:"):
                assert plan.predicted.energy_mj <= b.energy_mj * (1 + 1e-6)


def test_energy_under_slo_and_memory(graphs, snapdragon):
    device, server = snapdragon
    # resnet18, not googlenet: the same checks, and googlenet's MILP under the memory limit alone
    # took 4.6 s of the test's 7 (its plans at every bandwidth are tested above)
    graph = graphs["resnet18"]
    link = network_link("wifi", bandwidth_mbps=100)
    free = partition(graph, device, server=server, link=link, objective="energy")
    fast = partition(graph, device, server=server, link=link, objective="latency")
    # 3x: the energy plan without the SLO is all int8 on the NPU, which misses the accuracy budget;
    # with its worst unit dropped to fp32 the fastest plan is 2.3 ms, 2.3x the latency plan's 1.03
    # (which keeps its Gemm in fp32 on the CPU cores)
    slo = fast.predicted.latency_ms * 3.0
    plan = partition(graph, device, server=server, link=link, objective="energy", slo_ms=slo)
    assert plan.predicted.latency_ms <= slo
    assert plan.predicted.energy_mj >= free.predicted.energy_mj - 1e-6
    # a tiny NPU memory forces nodes elsewhere; the plan must fit it
    npu = replace(device.processor("npu"), memory_mb=2.0)
    small = replace(
        device, processors=tuple(npu if p.name == "npu" else p for p in device.processors)
    )
    from edgesplit.optimize.costs import build_costs
    from edgesplit.profile.predict import complete_profile

    plan = partition(graph, small, server=server, link=link)
    full = small.with_server(server)
    cm = build_costs(graph, complete_profile(graph, full, None), full, server=server, link=link)
    assign = np.array([cm.processors.index(plan.assignment[n]["processor"]) for n in cm.nodes])
    assert not violations(cm, assign)
    assert any(v["processor"] != "npu" for v in plan.assignment.values())
