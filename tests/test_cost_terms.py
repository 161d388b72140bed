"""The cost terms beyond nodes: the part-level schedule (pure), and each measured term against a
micro-measurement on a synthetic graph through the real runtime (structure and generous ratios,
never absolute timing thresholds)."""

from __future__ import annotations

import platform
import time
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import make_model, rand
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from edgesplit.compile.manual import contiguous_plan
from edgesplit.device.spec import load_device
from edgesplit.model.load import load_model
from edgesplit.optimize.costs import CostModel, Flow, build_costs
from edgesplit.optimize.exact import solve_sequential
from edgesplit.optimize.overheads import Overheads, PairCost, noise_rel, none
from edgesplit.optimize.schedule import boundary_ms, layout, schedule
from edgesplit.optimize.search import fewest_parts
from edgesplit.optimize.solve import solve
from edgesplit.optimize.synthetic import random_costs
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import ProcessorProfile, Profile
from edgesplit.profile.terms import IDLE_GAPS_MS, contention_factor
from edgesplit.runtime.harness import benchmark, random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle

# ---- the part-level schedule, on cost models made by hand


def hand_model(
    procs: list[str], node_ms: list[list[float]], edges: list[tuple[int, int]], nbytes: int = 1000
):
    """Nodes ``n0..`` with ``node_ms[n][p]``; each edge a tensor ``t<src>`` (one flow per source);
    node 0 reads the graph input, the last node writes the graph output."""
    n_nodes, n_procs = len(node_ms), len(procs)
    ms = np.array(node_ms, dtype=float)
    readers: dict[int, list[int]] = {}
    for a, b in edges:
        readers.setdefault(a, []).append(b)
    flows = [Flow("x", nbytes, -1, (0,))]
    for n in range(n_nodes):
        flows.append(Flow(f"t{n}", nbytes, n, tuple(readers.get(n, ())), n == n_nodes - 1))
    channel = np.arange(n_procs * n_procs).reshape(n_procs, n_procs) + 2
    return CostModel(
        nodes=tuple(f"n{i}" for i in range(n_nodes)),
        op_types=("Op",) * n_nodes,
        processors=tuple(procs),
        kinds=("cpu",) * n_procs,
        remote=np.zeros(n_procs, dtype=bool),
        home=0,
        node_ms=ms,
        node_mj=ms,
        backend=tuple(tuple("ort" for _ in procs) for _ in range(n_nodes)),
        allowed=np.ones_like(ms, dtype=bool),
        flows=tuple(flows),
        link_ms=np.zeros((n_procs, n_procs)),
        link_ms_per_byte=np.zeros((n_procs, n_procs)),
        radio_w=np.zeros((n_procs, n_procs)),
        channel=channel,
        idle_w=np.zeros(n_procs),
        mem_nbytes=np.zeros(n_nodes),
        mem_limit_nbytes=np.full(n_procs, np.inf),
    )


def with_terms(cm: CostModel, **kw) -> CostModel:
    base = none(cm.n_nodes, cm.n_procs, len(cm.flows))
    fields = {
        f: getattr(base, f)
        for f in ("pair", "blocked_out", "blocked_in", "handoff_gaps_ms", "handoff_ms")
    }
    fields.update(kw)
    return replace(cm, overheads=Overheads(**fields))


def test_a_part_starts_when_the_whole_part_it_reads_has_ended():
    """Diamond: A (big) feeds B (little) and C (big); D (big) joins them. The runtime runs {A, C} as
    one part, whose outputs are released at its end, so B cannot start after A alone."""
    cm = hand_model(
        ["big", "little"], [[1, 9], [5, 2], [4, 9], [1, 9]], [(0, 1), (0, 2), (1, 3), (2, 3)]
    )
    s = schedule(cm, np.array([0, 1, 0, 0]))
    parts = {tuple(p): k for k, p in enumerate(s.parts)}
    ac, b, d = parts[(0, 2)], parts[(1,)], parts[(3,)]
    assert s.part_start_ms[b] == pytest.approx(s.part_end_ms[ac])  # not at A's end (1 ms)
    assert s.part_end_ms[ac] == pytest.approx(5.0)
    assert s.part_start_ms[d] == pytest.approx(max(s.part_end_ms[b], s.part_end_ms[ac]))
    assert s.makespan_ms == pytest.approx(5 + 2 + 1)


def test_workers_serve_parts_first_ready_first():
    """Two parts wait for little while it runs a long one; the one ready first runs first, even
    though the other leads to a long tail (a HEFT rank would put that one first). The runtime does
    the same: each processor's worker is a FIFO queue fed as parts become ready."""
    #  n0 little (10 ms, reads the input)
    # n1 big 1 ms -> n2 little 1 ms ; n3 big 1 ms (reads n1, so ready later) -> n4 little 1 ms -> n5
    # big 20 ms
    ms = [[9, 10], [1, 9], [9, 1], [1, 9], [9, 1], [20, 90]]
    edges = [(1, 2), (1, 3), (3, 4), (4, 5), (0, 5), (2, 5)]
    cm = hand_model(["big", "little"], ms, edges)
    cm = replace(cm, flows=(Flow("x", 10, -1, (0, 1)), *cm.flows[1:]))
    assign = np.array([1, 0, 1, 0, 1, 0])
    # n1 and n3 on big are one part; make them two (n3 on big's other backend) so they end apart
    backend = [list(r) for r in cm.backend]
    backend[3][0] = "tvm"
    cm = replace(cm, backend=tuple(tuple(r) for r in backend))
    s = schedule(cm, assign)
    part_of = {n: k for k, p in enumerate(s.parts) for n in p}
    n2, n4 = part_of[2], part_of[4]
    assert s.part_start_ms[n2] == pytest.approx(10.0)  # ready at 1 ms, waits for n0
    assert s.part_start_ms[n4] == pytest.approx(11.0)  # ready at 2 ms: second in little's queue
    assert s.makespan_ms == pytest.approx(12 + 20)


def test_hand_off_only_onto_an_idle_worker_and_it_grows_with_the_gap():
    cm = hand_model(["big", "little"], [[1, 9], [9, 3], [1, 9]], [(0, 1), (1, 2)])
    gaps = np.tile([0.0, 10.0], (2, 1))
    handoff = np.array([[0.1, 0.5], [0.2, 1.2]])
    timed = with_terms(cm, handoff_gaps_ms=gaps, handoff_ms=handoff)
    s = schedule(timed, np.array([0, 1, 0]))
    plain = schedule(cm, np.array([0, 1, 0]))
    assert s.handoffs_ms > 0
    # three hand-offs (onto big at the start, little, big again), each after its worker's idle gap
    assert s.makespan_ms - plain.makespan_ms == pytest.approx(s.handoffs_ms)
    # a part its own worker made ready starts at once: a chain on one processor has one hand-off,
    # back to back with the previous request
    one = schedule(timed, np.array([0, 0, 0]))
    assert one.handoffs_ms == pytest.approx(0.1)


def test_a_stream_pays_a_back_to_back_hand_off_per_part_run():
    """big runs two parts per request (n0 and n2, little's n1 between them): in a stream each of
    them pays big's hand-off at zero idle gap, the one part on little little's."""
    from edgesplit.optimize.pipeline import period_ms

    cm = hand_model(["big", "little"], [[1, 9], [9, 1.5], [1, 9]], [(0, 1), (1, 2)])
    x = np.array([0, 1, 0])
    assert period_ms(cm, x) == pytest.approx(2.0)
    gaps = np.tile([0.0, 10.0], (2, 1))
    timed = with_terms(cm, handoff_gaps_ms=gaps, handoff_ms=np.array([[0.1, 0.5], [0.6, 1.2]]))
    assert period_ms(timed, x) == pytest.approx(max(2.0 + 2 * 0.1, 1.5 + 0.6))
    one = with_terms(cm, handoff_gaps_ms=gaps, handoff_ms=np.array([[0.1, 0.5], [0.3, 1.2]]))
    assert period_ms(one, x) == pytest.approx(2.0 + 2 * 0.1)


def test_fixed_cost_per_part_and_boundary_bytes_and_reorders():
    cm = hand_model(["cpu"], [[1], [1], [1]], [(0, 1), (1, 2)], nbytes=4_000_000)
    cm = replace(cm, backend=(("ort",), ("tvm",), ("ort",)))  # three parts on one processor
    pair = {(0, "ort"): PairCost(0.2, 0.0, 1e-7, 2e-7), (0, "tvm"): PairCost(0.3, 1e-7, 1e-7, 0.0)}
    blocked_out = np.array([[False], [True], [False], [False]])  # t0 (made by n0) is blocked on ort
    blocked_in = np.array([[False], [False], [True]])  # n2 reads its input blocked
    timed = with_terms(cm, pair=pair, blocked_out=blocked_out, blocked_in=blocked_in)
    x = np.zeros(3, dtype=np.int64)
    lay = layout(timed, x)
    extra = boundary_ms(timed, x, lay.parts, np.arange(3), ["ort", "tvm", "ort"])
    mb4 = 4_000_000
    assert extra[0] == pytest.approx(0.2 + mb4 * (1e-7 + 2e-7))  # out + reorder of t0
    assert extra[1] == pytest.approx(
        0.3 + mb4 * 1e-7 + mb4 * 1e-7
    )  # in t0, out t1 (no reorders on tvm)
    assert extra[2] == pytest.approx(0.2 + mb4 * 2e-7)  # in t1, reordered into n2's layout
    assert schedule(timed, x).makespan_ms == pytest.approx(3 + extra.sum())


def test_a_tensor_s_own_reorder_figure_is_charged_over_the_per_mb_rate():
    """Where the profiler measured a reorder of the very tensor (its shape), that figure is charged;
    the per-MB rate prices only the tensors it did not measure."""
    cm = hand_model(["cpu"], [[1], [1], [1]], [(0, 1), (1, 2)], nbytes=4_000_000)
    pair = {
        (0, "ort"): PairCost(
            0.2, 0.0, 0.0, 2e-7, reorder_in_ms={"t1": 0.07}, reorder_out_ms={"t0": 0.05}
        )
    }
    blocked_out = np.array(
        [[False], [True], [True], [False]]
    )  # t0 and t1 leave their parts blocked
    blocked_in = np.array([[False], [True], [True]])  # n1 and n2 read their inputs blocked
    timed = with_terms(cm, pair=pair, blocked_out=blocked_out, blocked_in=blocked_in)
    x = np.zeros(3, dtype=np.int64)
    extra = boundary_ms(timed, x, [[0], [1], [2]], np.arange(3), ["ort"] * 3)
    mb4 = 4_000_000
    assert extra[0] == pytest.approx(0.2 + 0.05)  # t0 out: its own figure
    assert extra[1] == pytest.approx(0.2 + mb4 * 2e-7 + mb4 * 2e-7)  # t0 in, t1 out: the rate
    assert extra[2] == pytest.approx(0.2 + 0.07)  # t1 in: its own figure


def test_contention_slows_only_overlapping_parts():
    """n0 on big and n1 on little both read the input and overlap for 4 ms; a chain does not."""
    cm = hand_model(["big", "little"], [[4, 9], [9, 4]], [])
    cm = replace(
        cm,
        flows=(Flow("x", 10, -1, (0, 1)), Flow("y0", 10, 0, (), True), Flow("y1", 10, 1, (), True)),
    )
    contention = np.array([[1.0, 1.5], [1.25, 1.0]])
    s = schedule(with_terms(cm, contention=contention), np.array([0, 1]))
    assert schedule(cm, np.array([0, 1])).makespan_ms == pytest.approx(4)
    part = {tuple(p): k for k, p in enumerate(s.parts)}
    assert s.part_ms[part[(0,)]] == pytest.approx(4 * 1.5)
    assert s.part_ms[part[(1,)]] == pytest.approx(4 * 1.25)
    assert s.makespan_ms == pytest.approx(6)
    chain = hand_model(["big", "little"], [[4, 9], [9, 4]], [(0, 1)])
    c = schedule(with_terms(chain, contention=contention), np.array([0, 1]))
    assert c.part_ms.tolist() == [4, 4]


class _Switch:
    """What :func:`contention_factor` needs of a :class:`BackgroundLoad`: on() and off()."""

    running = False

    def on(self) -> None:
        self.running = True

    def off(self) -> None:
        self.running = False


def test_contention_is_estimated_over_a_time_not_a_fixed_count_of_runs():
    """A processor 1.10x slower under load, 10% noise on each run (what a shared VM gives): given
    the time (here up to its 40 rounds, as the runs take none), the estimate is within 6% of 1.10 in
    every seeded trial; the 4 rounds of 3 + 3 runs the profiler used to stop at miss by more in some
    (on this machine they measured 0.92-1.46 for two cores that slow each other by about 1.00)."""

    def estimate(seed: int, min_s: float) -> float:
        rng, load = np.random.default_rng(seed), _Switch()

        def timed() -> float:
            return 12.0 * (1.10 if load.running else 1.0) * float(rng.lognormal(0.0, 0.1))

        return contention_factor(timed, load, rounds=4, min_s=min_s)

    long = [estimate(seed, 60.0) for seed in range(20)]
    short = [estimate(seed, 0.0) for seed in range(20)]
    assert all(abs(f / 1.10 - 1) <= 0.06 for f in long), long
    assert any(abs(f / 1.10 - 1) > 0.06 for f in short), short


def test_fewer_parts_within_the_noise():
    cm = hand_model(
        ["big", "little"], [[1, 9], [5, 2], [4, 9], [1, 9]], [(0, 1), (0, 2), (1, 3), (2, 3)]
    )
    whole, split = np.zeros(4, dtype=np.int64), np.array([0, 1, 0, 0])
    visited = [(10.0, split), (10.3, whole)]
    assert fewest_parts(cm, visited, 0.05)[0] is whole
    assert fewest_parts(cm, visited, 0.01)[0] is split


def test_the_noise_is_the_noisiest_measured_pair_s_capped():
    """Plans are equal within the noisiest measured pair's spread (p90 / median - 1 of its whole
    model), not the median pair's: a quiet short block must not hide a processor's drift."""

    def entry(proc, backend, p90_ms, source="measured"):
        return ProcessorProfile(
            proc, backend, source, {}, whole_model_ms=10.0, whole_model_p90_ms=p90_ms
        )

    quiet_tvm = [entry("big", "tvm", 10.1), entry("little", "tvm", 10.2)]
    prof = Profile("0" * 64, "m", "host-biglittle", {}, (*quiet_tvm, entry("big", "ort", 10.8)))
    assert noise_rel(prof) == pytest.approx(0.08)  # the median of the three is 0.02
    wild = (*quiet_tvm, entry("little", "ort", 14.0), entry("big", "ort", 50.0, source="predicted"))
    assert noise_rel(replace(prof, entries=wild)) == pytest.approx(
        0.10
    )  # capped; predictions left out
    assert noise_rel(replace(prof, entries=(entry("big", "ort", 50.0, source="predicted"),))) == 0.0


def test_two_unconnected_nodes_are_not_a_chain_whose_makespan_is_its_sequential_latency():
    """n1 reads nothing, so it runs while the graph input travels to n0: on p2 both end at 0.53 ms,
    against 0.55 on p1, which the sequential model prefers (it adds the input's trip). The shortcut
    for chains took the sequential optimum for the makespan's (a hypothesis example found it)."""
    cm = hand_model(["p0", "p1", "p2"], [[0.66, 0.24, 0.17], [0.88, 0.31, 0.36]], [])
    cm = replace(cm, link_ms=np.array([[0, 0.06, 0.16], [0.04, 0, 0.19], [0.03, 0.2, 0]]))
    assert solve_sequential(cm, "latency").assign.tolist() == [1, 1]
    alone = min(schedule(cm, np.full(2, p)).makespan_ms for p in range(3))
    assert alone == pytest.approx(0.53)  # p2: n1 for 0.36 ms, then n0 for 0.17
    assert solve(cm, "latency").schedule.makespan_ms <= alone + 1e-9


def split_chain():
    """A 4-node chain on two cores, core1 slightly cheaper after the first node, and a fixed cost
    of 0.5 ms per part: the sequential models split it after node 0."""
    cm = hand_model(
        ["core0", "core1"],
        [[1.0, 1.2], [2.0, 1.8], [2.0, 1.8], [2.0, 1.8]],
        [(0, 1), (1, 2), (2, 3)],
    )
    return with_terms(
        replace(cm, idle_w=np.array([0.1, 0.1])),
        pair={(0, "ort"): PairCost(0.5), (1, "ort"): PairCost(0.5)},
        active_w=np.array([1.0, 1.0]),
    )


@st.composite
def part_cost_models(draw) -> CostModel:
    """Random DAGs on 2-3 local processors with a fixed cost per part (0-2 ms)."""
    n, p = draw(st.integers(2, 9)), draw(st.integers(2, 3))
    cm = random_costs(n, p, draw(st.integers(0, 2**31 - 1)), n_remote=0, unsupported=0.0)
    part_ms = draw(st.floats(0.0, 2.0))
    return with_terms(
        cm, pair={(q, "ort"): PairCost(part_ms) for q in range(p)}, active_w=np.ones(p)
    )


def test_an_energy_plan_pays_its_parts_and_never_costs_more_than_one_processor():
    """The sequential energy model cannot see parts: its optimum here is a 2-part split, which the
    part's fixed cost makes dearer than core1 alone. The plan is priced, and chosen, on the
    schedule's energy (squeezenet on host-2core shipped such a split, measured 1.26x slower than
    one core)."""
    cm = split_chain()
    split = solve_sequential(cm, "energy").assign
    assert split.tolist() == [0, 1, 1, 1]  # what the sequential model alone would ship
    out = solve(cm, "energy")
    core1 = next(b for b in out.baselines if b.name == "only:core1")
    assert schedule(cm, split).energy_mj > core1.energy_mj
    assert out.assign.tolist() == [1, 1, 1, 1]
    assert out.schedule.energy_mj == pytest.approx(core1.energy_mj)
    assert all(out.schedule.energy_mj <= b.energy_mj + 1e-6 for b in out.baselines if b.feasible)


@settings(deadline=None)
@given(part_cost_models())
def test_the_energy_plan_is_never_dearer_than_a_baseline_with_part_costs(cm):
    out = solve(cm, "energy")
    for b in out.baselines:
        if b.feasible:
            assert out.schedule.energy_mj <= b.energy_mj + 1e-6, (
                b.name
            )  # baselines are rounded to 1e-6


def test_no_pareto_point_is_beaten_by_one_processor_alone():
    """The same split is also faster than core0 alone, so the sequential model put it on the
    front; priced with its part, core1 alone is both faster and leaner, and the front is that one
    point."""
    out = solve(split_chain(), "pareto")
    assert out.assign.tolist() == [1, 1, 1, 1]
    assert [p["processors"] for p in out.pareto] == [["core1"]]


@pytest.mark.slow
@settings(deadline=None)
@given(part_cost_models())
def test_pareto_points_are_never_dominated_by_a_baseline(cm):
    out = solve(cm, "pareto")
    for point in out.pareto:
        for b in out.baselines:
            strictly = (
                b.latency_ms < point["latency_ms"] - 1e-6
                and b.energy_mj < point["energy_mj"] - 1e-6
            )
            assert not (b.feasible and strictly), (b.name, point)


# ---- measured terms against the real runtime


@pytest.fixture(scope="module")
def chain_model(tmp_path_factory):
    """A chain of 1x1 convolutions on a 64-channel 56x56 map (800 KB activations): CNN parts whose
    boundaries ORT brackets with layout reorders."""
    nodes, weights = [], []
    prev = "x"
    for i in range(6):
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        weights.append((f"w{i}", rand(64, 64, 1, 1, seed=i)))
        prev = f"r{i}"
    m = make_model(nodes, [("x", [1, 64, 56, 56])], [(prev, [1, 64, 56, 56])], weights)
    path = tmp_path_factory.mktemp("terms") / "chain.onnx"
    onnx.save(m, path)
    return load_model(path)


@pytest.fixture(scope="module")
def chain_profile(chain_model):
    return profile_model(
        chain_model, load_device("host-2core"), ProfileOptions(["ort"], runs=10, warmup=3)
    )


@pytest.mark.slow
@pytest.mark.measures
def test_the_profiler_measures_every_term(chain_profile):
    for e in chain_profile.entries:
        t = e.terms
        assert t is not None, e.key
        assert t.part_fixed_ms >= 0 and t.input_ms_per_mb >= 0 and t.output_ms_per_mb >= 0
        assert t.reorder_ms_per_mb is not None and t.reorder_ms_per_mb > 0  # ORT's NCHWc Conv
        assert t.handoff_idle_ms == IDLE_GAPS_MS and len(t.handoff_ms) == len(t.return_ms) == len(
            IDLE_GAPS_MS
        )
        assert all(v >= 0 for v in t.handoff_ms + t.return_ms)
        # every conv output inside the whole model stays blocked; conv1.. read blocked inputs
        assert {"r0", "r1", "r4"} <= set(t.blocked_tensors) and "r5" not in t.blocked_tensors
        assert {"conv1", "conv5"} <= set(t.blocked_readers) and "relu1" not in t.blocked_readers
        # each blocked tensor's own reorders, into and out of the layout, measured at its shape
        assert set(t.reorder_in_ms) == set(t.reorder_out_ms) == set(t.blocked_tensors)
        assert all(v > 0 for v in [*t.reorder_in_ms.values(), *t.reorder_out_ms.values()])
        if e.processor == "core0+core1":  # a core group never runs beside its members
            assert not t.contention
            continue
        other = "core1" if e.processor == "core0" else "core0"
        assert set(t.contention) == {other} and t.contention[other] > 0


def _optimised_ops(path) -> list[str]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(path) + ".opt.onnx"
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


@pytest.mark.slow
def test_reorders_at_a_conv_boundary_are_those_ort_adds(chain_model, chain_profile, tmp_path):
    """Cut the conv chain in three: the model charges one ReorderOutput where a part hands on a
    blocked tensor and one ReorderInput where a blocked reader takes it; ORT's optimised parts have
    exactly those (the whole model has none)."""
    plan = contiguous_plan(chain_model, "host-2core", [("core0", "ort")] * 3)
    compile_bundle(chain_model, plan, tmp_path / "b")
    ops = [
        op for p in sorted((tmp_path / "b" / "parts").glob("*.onnx")) for op in _optimised_ops(p)
    ]
    whole = _optimised_ops(chain_model.path)
    cm = build_costs(chain_model, chain_profile, load_device("host-2core"))
    ov = cm.ov
    predicted_out = predicted_in = 0
    for i, f in enumerate(cm.flows):
        part = {plan.part_of(cm.nodes[d]).name for d in f.dsts}
        if f.src >= 0 and part - {plan.part_of(cm.nodes[f.src]).name}:
            predicted_out += bool(ov.blocked_out[i, 0])
            predicted_in += any(ov.blocked_in[d, 0] for d in f.dsts)
    assert (predicted_out, predicted_in) == (2, 2)
    # the whole model has its own reorders at the graph's input and output; the cuts add the rest
    assert ops.count("ReorderOutput") - whole.count("ReorderOutput") == predicted_out
    assert ops.count("ReorderInput") - whole.count("ReorderInput") == predicted_in


def _median_latency(
    bundles: dict[str, object], rounds: int = 6, block: int = 10, q: float = 0.5
) -> dict[str, float]:
    """The ``q`` quantile (median by default) of each bundle's latency, in alternating blocks (drift
    on a shared machine cancels; a low ``q`` keeps the runs the machine's other load left alone),
    each block after a pause and an untimed run. Each bundle is called from a thread of its own,
    as an app's thread would call it: a one-part bundle on one core keeps its caller pinned there,
    and another bundle called from that thread would then share the core with its own caller."""
    from concurrent.futures import ThreadPoolExecutor

    from edgesplit.runtime.harness import single_requests_ms

    sessions = {k: load(v) for k, v in bundles.items()}
    callers = {k: ThreadPoolExecutor(1) for k in bundles}
    times: dict[str, list[float]] = {k: [] for k in bundles}

    def block_of(s, feeds, n: int) -> list[float]:
        s.run(feeds)
        return single_requests_ms(s, feeds, n)

    try:
        feeds = random_feeds(next(iter(sessions.values())))
        for k, s in sessions.items():
            callers[k].submit(block_of, s, feeds, 2).result()
        for _ in range(rounds):
            for k, s in sessions.items():
                # the other bundle's ORT threads go quiet first: a block straight after another
                # session's ran 1.3-2x slower throughout here (benchmarks/honest_baselines.py)
                time.sleep(0.2)
                times[k].extend(callers[k].submit(block_of, s, feeds, block).result())
    finally:
        for k, s in sessions.items():
            s.close()
            callers[k].shutdown(wait=True)
    return {k: float(np.quantile(v, q)) for k, v in times.items()}


@pytest.mark.slow
@pytest.mark.measures
def test_an_extra_part_costs_what_the_model_says(chain_model, chain_profile, tmp_path):
    """One processor, the same chain as 1 and as 3 parts: the extra two parts (fixed costs, bytes
    out and in, reorders) are predicted within a generous factor of what the runtime pays, as a
    share of the whole chain's latency."""
    cm = build_costs(chain_model, chain_profile, load_device("host-2core"))
    bundles = {}
    for n in (1, 3):
        plan = contiguous_plan(chain_model, "host-2core", [("core0", "ort")] * n)
        compile_bundle(chain_model, plan, tmp_path / f"b{n}")
        bundles[n] = tmp_path / f"b{n}"
    got = _median_latency(bundles, rounds=8, q=0.2)  # the model prices an unloaded machine
    x = np.zeros(cm.n_nodes, dtype=np.int64)
    backends = [b[0] for b in cm.backend]
    split = contiguous_plan(chain_model, "host-2core", [("core0", "ort")] * 3)
    parts = [[cm.nodes.index(n) for n in p.nodes] for p in split.parts]
    part_of = np.zeros(cm.n_nodes, dtype=np.int64)
    for k, p in enumerate(parts):
        part_of[p] = k
    whole = boundary_ms(
        cm, x, [list(range(cm.n_nodes))], np.zeros(cm.n_nodes, dtype=np.int64), backends
    )
    extra_predicted = float(boundary_ms(cm, x, parts, part_of, backends).sum() - whole.sum())
    one_predicted = schedule(cm, x).makespan_ms
    assert extra_predicted > 0
    # as a share of the 1-part latency, so that a loaded machine (everything slower) cancels out
    share_measured, share_predicted = got[3] / got[1] - 1, extra_predicted / one_predicted
    assert 0.25 <= share_measured / share_predicted <= 4.0, (got, extra_predicted, one_predicted)


@pytest.mark.slow
@pytest.mark.measures
def test_a_busy_worker_starts_its_next_queued_part_a_hand_off_later(
    chain_model, chain_profile, tmp_path
):
    """The chain as a 2-stage pipeline (core0, then core1), in a stream: the worker that sets the
    pace has its next part queued before the last one ends, and still starts it some time after the
    last one's outputs are collected (the Session's bookkeeping: the next stage launched on the
    other worker, the request resolved; the thread pool's pick-up). The period charges the profiled
    hand-off at zero idle gap for it. Measured here: 0.02-0.05 ms against hand-offs of 0.025-0.045
    (three runs); 0.07-0.12 ms in the pipelines of plan_truth, whose workers also feed each other.
    So the same order as the hand-off, never nothing: between a quarter of it and four times it."""
    plan = contiguous_plan(chain_model, "host-2core", [("core0", "ort"), ("core1", "ort")])
    compile_bundle(chain_model, plan, tmp_path / "b2")
    with load(tmp_path / "b2") as sess:
        feeds = random_feeds(sess)
        for _ in sess.run_stream([feeds] * 10):
            pass
        sess.reset_stats()
        for _ in sess.run_stream([feeds] * 120):
            pass
        runs = sess.trace_records().parts
    queued = {}
    for lane in ("core0", "core1"):
        rs = sorted((r for r in runs if r.lane == lane), key=lambda r: r.start_ns)
        queued[lane] = [
            (b.start_ns - a.collected_ns) / 1e6
            for a, b in zip(rs, rs[1:])
            if b.submit_ns <= a.collected_ns
        ]
    lane = max(queued, key=lambda k: len(queued[k]))
    assert len(queued[lane]) > 60, {
        k: len(v) for k, v in queued.items()
    }  # that worker's queue stayed full
    # the hand-off as profiled at the two shortest idle gaps (0 and 1 ms): each is the median of a
    # few runs, and one alone came out at 0.0096 ms once (against a gap of 0.040 ms)
    terms = chain_profile.entry(lane, "ort").terms
    low, high = sorted(terms.handoff_ms[:2])
    gap = float(np.median(queued[lane]))
    assert 0.25 * low <= gap <= 4 * high, (lane, gap, terms.handoff_ms[:2])


@pytest.mark.slow
@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="ORT's NCHWc layout is x86's"
)
@pytest.mark.measures
def test_reorders_at_a_cut_cost_what_the_profiler_measured_for_that_tensor(tmp_path):
    """A chain of 1x1 convolutions on 512 channels at 13x13, cut in the middle: the reorders the
    runtime's own trace shows at the cut (the 2-part bundle's reorders over the whole model's) are
    what the profiler measured for that tensor, within a generous factor. Both are taken as a share
    of the convolutions' own time measured beside them, so that the machine's speed cancels (a CI
    run saw the cut's reorders at 0.394 ms against 0.118-0.317 ms in three quiet runs). The factor
    is wide because the profiler's figure is the noisy side: as a share of the convolutions it was
    0.017-0.073 over six profiles, the runtime's 0.039-0.064; measured over profiled 0.56-2.78.
    (The per-MB rate, measured on 64 channels, priced them 2.0-6.0x too low here, and 2.8-10x on
    squeezenet's cuts: this model is the kind of boundary it missed.)"""
    nodes, weights, prev = [], [], "x"
    for i in range(4):
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        weights.append((f"w{i}", rand(512, 512, 1, 1, seed=i) * 0.05))
        prev = f"r{i}"
    onnx.save(
        make_model(nodes, [("x", [1, 512, 13, 13])], [(prev, [1, 512, 13, 13])], weights),
        tmp_path / "m.onnx",
    )
    graph = load_model(tmp_path / "m.onnx")
    prof = profile_model(
        graph,
        load_device("host-2core"),
        ProfileOptions(["ort"], processors=["core0"], runs=10, warmup=3),
    )
    entry = prof.entry("core0", "ort")
    t = entry.terms
    plans = {n: contiguous_plan(graph, "host-2core", [("core0", "ort")] * n) for n in (1, 2)}
    cut = plans[2].parts[0].outputs[0]
    for n, plan in plans.items():
        compile_bundle(graph, plan, tmp_path / f"b{n}")
    reorders: dict[int, list[float]] = {1: [], 2: []}
    convs: list[float] = []
    for _ in range(4):  # alternating blocks: the machine's drift falls on both bundles
        for n in plans:
            with load(tmp_path / f"b{n}", detailed=True) as sess:  # ORT's profiler: one benchmark
                parts = benchmark(sess, random_feeds(sess), repeat=8, warmup=2).breakdown.parts
            reorders[n].append(sum(p.reorder_ms or 0.0 for p in parts))
            convs.append(sum((p.kernels_ms or 0.0) - (p.reorder_ms or 0.0) for p in parts))
    measured = (np.median(reorders[2]) - np.median(reorders[1])) / np.median(convs)
    table = (t.reorder_out_ms[cut] + t.reorder_in_ms[cut]) / entry.sum_ms
    per_mb = 2 * graph.tensors[cut].nbytes / 1e6 * t.reorder_ms_per_mb / entry.sum_ms
    assert 0.2 <= measured / table <= 5.0, (measured, table, per_mb)


@pytest.mark.slow
@pytest.mark.measures
def test_a_trivial_bundle_costs_the_session_and_its_wake_ups(tmp_path):
    """A one-node model as a 1-part bundle through the real Session: nearly all of its latency is
    the per-request terms (hand-off, the part's fixed cost, the caller's wake-up, the Session's
    work), which the model predicts within a generous factor; its kernel alone is a small share."""
    m = make_model(
        [helper.make_node("Neg", ["x"], ["y"], name="neg")], [("x", [1, 16])], [("y", [1, 16])]
    )
    onnx.save(m, tmp_path / "neg.onnx")
    graph = load_model(tmp_path / "neg.onnx")
    device = load_device("host-2core")
    prof = profile_model(
        graph, device, ProfileOptions(["ort"], processors=["core0"], runs=20, warmup=3)
    )
    plan = contiguous_plan(graph, "host-2core", [("core0", "ort")])
    compile_bundle(graph, plan, tmp_path / "b")
    got = _median_latency({"b": tmp_path / "b"}, rounds=4, block=50)["b"]
    cm = build_costs(graph, prof, device)
    predicted = schedule(cm, np.zeros(1, dtype=np.int64)).makespan_ms
    kernel = prof.entry("core0", "ort").nodes["neg"].latency_ms
    assert kernel < 0.5 * predicted
    # without those terms: 20x and more. The low end is loose: the Session runs a one-part
    # bundle in 10-18 us here, while the part's cost from four profiles of this 7 us kernel ranged
    # 0.021-0.062 ms (its whole-model calibration), so predicted/measured spans 1.5-8x
    assert 0.1 <= got / predicted <= 4.0, (got, predicted)


def _twin_backends(chain_profile):
    """The chain's profile on host-biglittle (whose processors have ORT and TVM; core0 as big ...),
    with ORT only, and with a TVM twin on big 1% faster on conv3 and 1.5x slower elsewhere."""
    names = {"core0": "big", "core1": "little", "core0+core1": "big+little"}

    def moved(e):
        terms = e.terms and replace(
            e.terms, contention={names[k]: v for k, v in e.terms.contention.items()}
        )
        # node sums as measured, not scaled to the whole-model time: the twin below has none, and a
        # whole-model run measured under load (say 2x the node sum) would scale ORT alone
        return replace(e, processor=names[e.processor], terms=terms, whole_model_ms=None)

    ort_only = replace(
        chain_profile, device="host-biglittle", entries=tuple(map(moved, chain_profile.entries))
    )
    big = ort_only.entry("big", "ort")
    faster = {
        n: replace(c, latency_ms=c.latency_ms * (0.99 if n == "conv3" else 1.5))
        for n, c in big.nodes.items()
    }
    return ort_only, replace(
        ort_only, entries=(*ort_only.entries, replace(big, backend="tvm", nodes=faster))
    )


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["latency", "pareto"])
def test_a_backend_faster_on_one_node_does_not_cut_a_processor_into_parts(
    chain_model, chain_profile, objective
):
    """A second backend 1% faster on one node: a plan that switched backends for it would pay two
    part boundaries for a few microseconds. The plan keeps one backend per processor instead, and
    predicts no worse than the plan without that backend (squeezenet on host-biglittle: five parts
    on big at 11.06 ms predicted against 9.30 for ORT alone, before). A trade-off (pareto) keeps it
    too, on both figures (squeezenet's point on big: 17.94 ms and 71.1 mJ against 11.86 and
    46.9)."""
    from edgesplit.optimize.planner import solve_plan
    from edgesplit.workflows.resolve import Choices, resolve

    ort_only, both = _twin_backends(chain_profile)

    def plan_for(profile):
        return solve_plan(
            resolve(chain_model, "host-biglittle", Choices(objective=objective, profile=profile))
        )

    plain, mixed = plan_for(ort_only), plan_for(both)
    for figure in ("latency_ms", "energy_mj") if objective == "pareto" else ("latency_ms",):
        assert getattr(mixed.predicted, figure) <= getattr(plain.predicted, figure) * (1 + 1e-9), (
            mixed.predicted,
            plain.predicted,
        )
    assert len(mixed.parts) == len(plain.parts)
    assert {p.backend for p in mixed.parts} == {"ort"}
    # the baselines too: only:big is ORT alone, not ORT parts around a TVM conv3
    ort_alone = {b.name: b.latency_ms for b in plain.baselines if b.feasible}
    for b in mixed.baselines:
        if b.name in ort_alone:
            assert b.latency_ms <= ort_alone[b.name] * (1 + 1e-9), (b, ort_alone[b.name])


@pytest.mark.slow
def test_band_plans_do_not_cut_a_processor_into_parts_for_a_backend_faster_on_one_node(
    chain_model, chain_profile
):
    """An adaptive bundle's plan per bandwidth weighs one backend per processor too (squeezenet on
    host with an H200 server: the plan below 105 Mbit/s was 12 ORT and TVM parts on the CPU at
    7.04 ms predicted, against 5.66 for ORT alone). With the TVM twin, no band plan is worse than
    the table without it, and none runs a TVM part."""
    from edgesplit.optimize.bands import band_plans, curves, problem_band_table, problem_pricings
    from edgesplit.workflows.resolve import Choices, resolve

    ort_only, both = _twin_backends(chain_profile)
    grid = np.logspace(-1, 3, 17)
    chosen = {}
    for key, profile in (("plain", ort_only), ("mixed", both)):
        problem = resolve(
            chain_model,
            "host-biglittle",
            Choices(profile=profile, server="server-a100", link="wifi"),
        )
        table = problem_band_table(problem, per_decade=1, max_evals=60)
        for plan in band_plans(problem, table):
            assert "tvm" not in {p.backend for p in plan.parts}, [
                (p.processor, p.backend) for p in plan.parts
            ]
        values = curves(
            problem_pricings(problem), table.objective, table.assigns, grid, table.pricing
        )
        chosen[key] = [values[table.band_at(bw).plan][i] for i, bw in enumerate(grid)]
    assert all(m <= p * (1 + 1e-6) for m, p in zip(chosen["mixed"], chosen["plain"])), chosen


def test_a_plan_s_baselines_are_each_the_cheaper_of_their_two_pricings():
    """A plan kept on each node's fastest backend shows the baselines as a user would run them:
    where one backend per processor prices a baseline cheaper, that figure."""
    from edgesplit.optimize.planner import _cheaper_baselines

    out = solve(split_chain(), "latency")
    dear = replace(
        out, baselines=tuple(replace(b, latency_ms=2 * b.latency_ms) for b in out.baselines)
    )
    got = _cheaper_baselines(dear, out, "latency")
    assert got.assign is dear.assign
    assert [b.latency_ms for b in got.baselines] == [b.latency_ms for b in out.baselines]
    assert _cheaper_baselines(out, dear, "latency").baselines == out.baselines


def test_a_server_part_pays_its_call_on_every_byte_it_is_sent_or_sends_back():
    """A call's fixed cost, and its cost per byte on every tensor the part is sent or sends back,
    graph inputs and outputs included, are charged to the server part's run and nothing else's;
    the linear forms charge them on crossings to and from the server."""
    cm = random_costs(4, 2, 5, n_remote=1, unsupported=0.0, chain=True)
    remote = int(np.flatnonzero(cm.remote)[0])
    called = replace(cm, overheads=replace(cm.ov, call_ms=0.7, call_ms_per_byte=2e-6))
    graph_in = sum(f.nbytes for f in cm.flows if f.src < 0)
    graph_out = sum(f.nbytes for f in cm.flows if f.to_home)
    everything = np.full(4, remote)  # the whole model on the server: one part, one call
    extra = layout(called, everything).work_ms - layout(cm, everything).work_ms
    assert extra == pytest.approx([0.7 + 2e-6 * (graph_in + graph_out)])
    half = np.array([cm.home, cm.home, remote, remote])  # the second half: sent the cut tensor
    cut = next(f.nbytes for f in cm.flows if f.src == 1)
    extra = layout(called, half).work_ms - layout(cm, half).work_ms
    assert extra == pytest.approx([0.0, 0.7 + 2e-6 * (cut + graph_out)])
    alpha, beta = called.ov.sequential_extra(cm.remote)
    assert alpha[cm.home, remote] == pytest.approx(0.7) and alpha[remote, cm.home] == 0.0
    assert beta[cm.home, remote] == beta[remote, cm.home] == pytest.approx(2e-6)
