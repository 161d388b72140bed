"""Refit: the pure fit of cost terms, and the closed loop on a real bundle."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, rand, run_cli
from onnx import helper
from test_cost_terms import hand_model, with_terms

from edgesplit.compile.manual import contiguous_plan
from edgesplit.device.spec import load_device, read_spec
from edgesplit.model.load import load_model
from edgesplit.optimize.overheads import PairCost
from edgesplit.optimize.refit import (
    Measured,
    Observed,
    RemoteCall,
    fit_handoffs,
    fit_pairs,
    fit_profile,
    fit_remote_call,
    uncalibrated,
)
from edgesplit.optimize.schedule import layout, schedule
from edgesplit.optimize.synthetic import random_costs
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import NodeCost, Profile, RunTerms, load_profile
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.refit import TURNS, measure, measure_alternating, plan_costs, refit
from edgesplit.workflows.resolve import partition

# ---- the pure fit


def test_fit_recovers_a_scale_and_a_fixed_cost():
    """Parts alternate between two processors; little's parts measure 1.7x their nodes plus 0.3 ms,
    big's as modelled. The fit finds both, and only on little."""
    ms = [[1, 2], [2, 3], [0.5, 4], [3, 1], [1, 5], [2, 2]]
    cm = hand_model(["big", "little"], ms, [(i, i + 1) for i in range(5)])
    cm = with_terms(cm, pair={(0, "ort"): PairCost(0.1), (1, "ort"): PairCost(0.1)})
    x = np.array([0, 1, 0, 1, 0, 1])
    lay = layout(cm, x)
    names = [f"p{k}" for k in range(len(lay.parts))]
    truth = {}
    for k in range(len(lay.parts)):
        nodes = lay.nodes_ms[k]
        truth[names[k]] = 1.7 * nodes + 0.3 if lay.proc[k] == 1 else nodes + 0.1
    measured = Measured(truth, (), 30.0, 29.0, 30)
    fits = {f.processor: f for f in fit_pairs([Observed(cm, x, tuple(names), measured)])}
    # every part here reads one tensor from another part: the fixed and the per-crossing cost
    # cannot be told apart, only their sum; the prior (the profile's terms) holds it back a little
    little, big = fits["little"], fits["big"]
    assert little.node_scale == pytest.approx(1.7, rel=0.05)
    assert little.part_fixed_ms + little.crossing_ms == pytest.approx(0.3, abs=0.06)
    assert big.node_scale == pytest.approx(1.0, rel=0.02)
    assert big.part_fixed_ms + big.crossing_ms == pytest.approx(0.1, abs=0.02)
    for k in range(len(lay.parts)):
        f = little if lay.proc[k] == 1 else big
        got = f.part_fixed_ms + f.crossing_ms * (k > 0) + f.node_scale * lay.nodes_ms[k]
        assert got == pytest.approx(truth[names[k]], rel=0.03)


def test_a_call_s_fixed_cost_and_cost_per_mb_are_recovered_from_two_payload_sizes():
    """Two server parts, 0.2 MB and 3 MB per call: each call measures the link's modelled time,
    its compute, 0.8 ms and 1.5 ms per MB. The fit finds both terms; the parts' runs on the device
    (whole calls) are left out of the pair fits."""
    cm = random_costs(6, 2, 3, n_remote=1, unsupported=0.0, chain=True)
    fast = np.where(
        cm.link_ms_per_byte > 0, 1e-6, 0.0
    )  # 8 Gbit/s: the calls' noise is not the link's
    cm = replace(cm, link_ms_per_byte=fast)
    remote = int(np.flatnonzero(cm.remote)[0])
    x = np.array([cm.home, remote, cm.home, remote, cm.home, cm.home])
    lay = layout(cm, x)
    names = tuple(f"p{k}" for k in range(len(lay.parts)))
    calls, part_ms = {}, {}
    for k, name in enumerate(names):
        part_ms[name] = float(lay.work_ms[k])
        if lay.proc[k] != remote:
            continue
        sent, received = (0.1e6, 0.1e6) if k == 1 else (2e6, 1e6)
        link = float(cm.link_ms[cm.home, remote] + cm.link_ms[remote, cm.home])
        link += sent * float(cm.link_ms_per_byte[cm.home, remote])
        link += received * float(cm.link_ms_per_byte[remote, cm.home])
        call = link + 2.0 + 0.8 + 1.5 * (sent + received) / 1e6
        calls[name] = RemoteCall(call, 2.0, sent, received, 30)
        part_ms[name] = call + 100.0  # a whole call: nothing the pair fit may see
    measured = Measured(part_ms, (), 50.0, 49.0, 30, remote=calls)
    fixed, per_mb, parts = fit_remote_call([Observed(cm, x, names, measured)])
    assert (
        parts == 2
        and fixed == pytest.approx(0.8, abs=0.1)
        and per_mb == pytest.approx(1.5, rel=0.05)
    )
    fits = fit_pairs([Observed(cm, x, names, measured)])
    assert {f.processor for f in fits} == {cm.processors[cm.home]}


def test_fit_keeps_the_measured_terms_where_parts_cannot_tell_them_apart():
    """One part per pair: the fixed cost stays near the profile's and the scale takes the rest."""
    cm = hand_model(["big"], [[4.0], [4.0]], [(0, 1)])
    cm = with_terms(cm, pair={(0, "ort"): PairCost(0.2)})
    fits = fit_pairs(
        [
            Observed(
                cm, np.zeros(2, dtype=np.int64), ("p0",), Measured({"p0": 12.2}, (), 12.5, 12.4, 30)
            )
        ]
    )
    assert fits[0].part_fixed_ms == pytest.approx(0.2, abs=0.1)
    assert fits[0].node_scale == pytest.approx(1.5, rel=0.03)


def _check_parts_on(proc: int, fit, ob: Observed, rel: float) -> None:
    """Each of ``ob``'s parts on ``proc`` is predicted by ``fit``'s terms as measured (within
    ``rel``); every part but the first reads one tensor from another part (a chain)."""
    lay = layout(ob.cm, ob.assign)
    for k, name in enumerate(ob.names):
        if lay.proc[k] == proc:
            entering = 1 if k > 0 else 0
            got = fit.part_fixed_ms + fit.crossing_ms * entering + fit.node_scale * lay.nodes_ms[k]
            assert got == pytest.approx(ob.measured.part_ms[name], rel=rel), (name, got)


def test_a_whole_model_bundle_beside_a_plan_pins_the_node_scale():
    """little really runs its nodes 1.5x slower than profiled plus 0.4 ms per part. A plan with one
    small part on little cannot tell the scale from the fixed cost (one row): alone it blames the
    scale. The whole model on little, calibrated together with it, tells them apart, and the joint
    terms predict both bundles."""
    ms = [[1.0, 1.0], [2.0, 4.0], [3.0, 5.0], [0.3, 0.5]]
    cm = hand_model(["big", "little"], ms, [(0, 1), (1, 2), (2, 3)])
    cm = with_terms(cm, pair={(0, "ort"): PairCost(0.1), (1, "ort"): PairCost(0.1)})

    def truth(x: np.ndarray) -> Observed:
        lay = layout(cm, x)
        names = tuple(f"p{k}" for k in range(len(lay.parts)))
        runs = {
            n: (1.5 * lay.nodes_ms[k] + 0.4 if lay.proc[k] == 1 else lay.nodes_ms[k] + 0.1)
            for k, n in enumerate(names)
        }
        return Observed(cm, x, names, Measured(runs, (), 20.0, 19.5, 30))

    plan, whole = truth(np.array([0, 0, 0, 1])), truth(np.array([1, 1, 1, 1]))
    alone = {f.processor: f for f in fit_pairs([plan])}["little"]
    joint = {f.processor: f for f in fit_pairs([plan, whole])}["little"]
    assert abs(alone.node_scale - 1.5) > 0.1, alone  # confounded: the scale took the fixed cost
    assert joint.node_scale == pytest.approx(1.5, rel=0.03), joint
    for ob in (plan, whole):
        _check_parts_on(1, joint, ob, rel=0.03)


def test_the_whole_model_on_a_processor_is_predicted_as_it_was_measured():
    """little's nodes run as profiled in the whole model, but each part of a 3-part plan on it ran
    30% slower per node (cold caches after a hand-off, say). Fitted jointly, the plan's three parts
    outweighed the one whole model and the fitted profile predicted the whole model 9% high. The
    whole model measures the node scale directly, so it anchors it: the whole model is predicted as
    measured, and the plan's extra time goes to its parts' fixed and crossing costs."""
    ms = [[1.0, 3.0], [1.0, 6.0], [1.0, 4.0], [1.0, 5.0], [1.0, 2.0]]
    cm = hand_model(["big", "little"], ms, [(i, i + 1) for i in range(4)])
    cm = with_terms(cm, pair={(0, "ort"): PairCost(0.1), (1, "ort"): PairCost(0.1)})

    def observed(x: np.ndarray, per_node: float) -> Observed:
        lay = layout(cm, x)
        names = tuple(f"p{k}" for k in range(len(lay.parts)))
        runs = {n: per_node * lay.nodes_ms[k] + 0.1 for k, n in enumerate(names)}
        return Observed(cm, x, names, Measured(runs, (), 30.0, 29.5, 30))

    whole = observed(np.ones(5, dtype=np.int64), 1.0)
    plan = observed(np.array([1, 0, 1, 0, 1]), 1.3)
    little = {f.processor: f for f in fit_pairs([plan, whole])}["little"]
    whole_ms = little.part_fixed_ms + little.node_scale * 20.0
    assert whole_ms == pytest.approx(whole.measured.part_ms["p0"], rel=0.01), little
    # the plan's parts (6, 4 and 2 ms of nodes) are predicted within what one fixed cost can carry
    _check_parts_on(1, little, plan, rel=0.25)


def test_contention_is_fitted_from_a_stream_and_restored_by_uncalibrated():
    """A two-stage pipeline: big's stage runs 1.3x slower while little is busy, little's 1.1x while
    big is (the runs of a stream, solved for its period). The profile says 1.0 for both; the fit
    finds both factors, they go into the profile (and out again with ``uncalibrated``), and the
    modelled period moves to the measured one."""
    from edgesplit.optimize.pipeline import period_ms
    from edgesplit.optimize.refit import Streamed, fit_contention
    from edgesplit.profile.store import ProcessorProfile

    cm = hand_model(["big", "little"], [[4.0, 9.0], [9.0, 3.0]], [(0, 1)])
    x = np.array([0, 1])
    little = 3.0 * 1.1  # big is the bottleneck: busy the whole period
    big = (4.0 + np.sqrt(16.0 + 4 * 4.0 * 0.3 * little)) / 2  # big = 4 (1 + 0.3 little / big)
    stream = Streamed(big, {"p0": big, "p1": little}, 30)
    ob = Observed(
        cm, x, ("p0", "p1"), Measured({"p0": 4.0, "p1": 3.0}, (), 7.2, 7.1, 30, stream=stream)
    )
    fitted = fit_contention([ob])
    assert fitted[("big", "little")] == pytest.approx(1.3, abs=0.02)
    assert fitted[("little", "big")] == pytest.approx(1.1, abs=0.02)

    terms = RunTerms(part_fixed_ms=0.0, contention={"little": 1.0})
    entries = tuple(
        ProcessorProfile(
            proc, "ort", "measured", {"n": NodeCost(1.0, 1.1)}, terms=replace(terms, contention=c)
        )
        for proc, c in (("big", {"little": 1.0}), ("little", {"big": 1.0}))
    )
    prof = Profile("a" * 64, "m", "dev", {}, entries)
    got, _ = fit_profile([ob], prof, "test")
    assert got.entries[0].terms.contention["little"] == fitted[("big", "little")]
    assert uncalibrated(got) == prof
    before = period_ms(cm, x)
    with_fit = with_terms(
        cm,
        pair=cm.ov.pair,
        contention=np.array([[1.0, fitted[("big", "little")]], [fitted[("little", "big")], 1.0]]),
    )
    after = period_ms(with_fit, x)
    assert abs(after - big) < 0.3 * abs(before - big), (before, after, big)


def test_a_stream_s_gap_before_a_queued_part_is_fitted_and_priced():
    """A stream's trace says big's worker starts a queued part 0.2 ms after the last one's outputs
    are collected (the profile's hand-off at zero idle gap, which stood for it, is 0.05): the fit
    writes it into the profile, the cost model reads it, the period charges it per part run, and
    ``uncalibrated`` takes it out. little's runs were never queued: its hand-off stands."""
    from types import SimpleNamespace

    from edgesplit.optimize.overheads import build_overheads
    from edgesplit.optimize.pipeline import period_ms
    from edgesplit.optimize.refit import Streamed
    from edgesplit.profile.store import ProcessorProfile
    from edgesplit.workflows.refit import queued_gaps_ms

    def run(lane, start_ms, collected_ms, submit_ms):
        ns = [int(v * 1e6) for v in (start_ms, collected_ms, submit_ms)]
        return SimpleNamespace(
            lane=lane, processor=lane, start_ns=ns[0], collected_ns=ns[1], submit_ns=ns[2]
        )

    runs = [run("big", k * 5.2, k * 5.2 + 5.0, 0.0) for k in range(8)]
    runs += [run("little", k * 9.0, k * 9.0 + 4.0, k * 9.0 - 0.5) for k in range(8)]
    gaps = queued_gaps_ms(runs)
    assert gaps == {"big": pytest.approx(0.2)}

    cm = hand_model(["big", "little"], [[4.0, 9.0], [9.0, 3.0], [4.0, 9.0]], [(0, 1), (1, 2)])
    x = np.array([0, 1, 0])
    names = tuple(f"p{k}" for k in range(len(layout(cm, x).parts)))
    ob = Observed(cm, x, names, Measured({}, (), 9.0, 8.9, 30, stream=Streamed(8.4, {}, 30, gaps)))
    terms = RunTerms(handoff_idle_ms=(0.0, 10.0), handoff_ms=(0.05, 0.3), return_ms=(0.0, 0.0))
    prof = Profile(
        "a" * 64,
        "m",
        "dev",
        {},
        tuple(
            ProcessorProfile(p, "ort", "measured", {"n": NodeCost(1.0, 1.1)}, terms=terms)
            for p in ("big", "little")
        ),
    )
    got, _ = fit_profile([ob], prof, "test")
    assert got.entry("big", "ort").terms.stream_gap_ms == pytest.approx(0.2)
    assert got.entry("little", "ort").terms.stream_gap_ms is None
    assert uncalibrated(got) == prof
    back = Profile.from_json(json.loads(json.dumps(got.to_json())))
    assert back.entry("big", "ort").terms.stream_gap_ms == pytest.approx(0.2)

    procs = [SimpleNamespace(name=n, is_remote=False, active_w=1.0) for n in ("big", "little")]
    ov = build_overheads(got, procs, cm.backend, list(cm.nodes), cm.flows, 0)
    assert ov.stream_gaps() == pytest.approx([0.2, 0.05])
    # big runs two parts per request (8 ms), little one (3 ms): two of big's gaps in the period
    assert period_ms(replace(cm, overheads=ov), x) == pytest.approx(8.0 + 2 * 0.2)


def test_hand_off_curve_takes_the_measured_medians_where_there_are_enough():
    curve = fit_handoffs(
        (0.0, 5.0, 20.0), (0.05, 0.2, 0.3), [(4.0, 0.5), (6.0, 0.7), (5.5, 0.6), (19.0, 1.0)]
    )
    assert curve == (0.05, 0.6, 0.3)  # one sample near 20 ms is not enough


def test_uncalibrated_restores_the_measured_terms():
    terms = RunTerms(
        part_fixed_ms=0.1, handoff_idle_ms=(0.0, 5.0), handoff_ms=(0.05, 0.2), session_ms=0.03
    )
    from edgesplit.profile.store import ProcessorProfile

    entry = ProcessorProfile("cpu", "ort", "measured", {"n": NodeCost(1.0, 1.1)}, terms=terms)
    prof = Profile("a" * 64, "m", "dev", {}, (entry,))
    cm = hand_model(["cpu"], [[1.0]], [])
    measured = Measured({"p0": 2.0}, (("cpu", 5.0, 0.9),) * 3, 3.0, 2.5, 30)
    fitted, _ = fit_profile(
        [Observed(cm, np.zeros(1, dtype=np.int64), ("p0",), measured)], prof, "test"
    )
    t = fitted.entries[0].terms
    assert t.calibrated == "test" and t.handoff_ms == (0.05, 0.9) and t.node_scale != 1.0
    back = Profile.from_json(json.loads(json.dumps(fitted.to_json())))
    assert back == fitted
    assert uncalibrated(back).entries[0].terms == terms


# ---- the closed loop on a real bundle


@pytest.fixture(scope="module")
def conv_chain(tmp_path_factory):
    nodes, weights = [], []
    prev = "x"
    for i in range(6):
        nodes.append(
            helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1])
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        weights.append((f"w{i}", rand(32, 32, 3, 3, seed=i)))
        prev = f"r{i}"
    m = make_model(nodes, [("x", [1, 32, 56, 56])], [(prev, [1, 32, 56, 56])], weights)
    d = tmp_path_factory.mktemp("cal")
    onnx.save(m, d / "chain.onnx")
    return load_model(d / "chain.onnx")


def _mis_scaled(profile: Profile, processor: str, factor: float) -> Profile:
    entries = []
    for e in profile.entries:
        if e.processor == processor:
            nodes = {
                k: replace(c, latency_ms=c.latency_ms * factor, p90_ms=c.p90_ms * factor)
                for k, c in e.nodes.items()
            }
            e = replace(
                e,
                nodes=nodes,
                whole_model_ms=e.whole_model_ms * factor,
                whole_model_p90_ms=e.whole_model_p90_ms * factor,
            )
        entries.append(e)
    return replace(profile, entries=tuple(entries))


@pytest.mark.slow
@pytest.mark.measures
def test_calibration_lowers_the_error_of_a_mis_scaled_profile(conv_chain, tmp_path):
    """core1's node costs made eight times too high in the profile: the plan (half the chain on
    each core) is mispredicted; after calibrating, its parts are predicted closer to a fresh
    measurement than before. The error is that of core1's part against core0's, both measured in
    the same requests, so a shared machine's load (which slows both) cancels out. Eight, not a
    smaller factor: other engineers' work can load one core several times more than the other
    for a while (seen: 4.5x under a load average of 13 on 2 cores), and the fit measures that
    too."""
    device = load_device("host-2core")
    good = profile_model(conv_chain, device, ProfileOptions(["ort"], runs=8, warmup=2))
    bad = _mis_scaled(good, "core1", 8.0)
    bad.save(tmp_path / "bad.json")
    half = len(conv_chain.nodes) // 2
    pins = {n.name: "core0" if i < half else "core1" for i, n in enumerate(conv_chain.nodes)}
    plan = partition(conv_chain, device, profile=str(tmp_path / "bad.json"), pins=pins)
    assert [p.processor for p in plan.parts] == ["core0", "core1"]
    compile_bundle(conv_chain, plan, tmp_path / "b")
    result = refit(tmp_path / "b", runs=15, warmup=3, max_rounds=2)
    assert result.profile.calibration["bundles"][0].endswith("b")
    fresh = measure(tmp_path / "b", runs=15, warmup=3)
    measured = fresh.part_ms["p1"] / fresh.part_ms["p0"]

    def error(profile: Profile) -> float:
        costs = plan_costs(plan, profile)
        part_ms = schedule(costs.cm, costs.assign, costs.parts).part_ms
        return abs(float(np.log(part_ms[1] / part_ms[0] / measured)))

    before, after = error(bad), error(result.profile)
    assert after < before, (before, after, result.rounds)
    fit = {f.processor: f for f in result.rounds[-1].fits}
    # it found the mis-scale: core1 against core0, so that load slowing both since profiling cancels
    assert fit["core1"].node_scale / fit["core0"].node_scale < 0.6, result.rounds[-1].fits


@pytest.mark.slow  # profiles, then runs the bundle in two rounds in two CLI processes
def test_a_round_measures_its_bundles_in_alternating_turns(conv_chain, tmp_path, monkeypatch):
    """Each bundle's runs come in turns that rotate between the bundles, so that a slow phase of
    the machine falls on every bundle alike, not on one bundle's block (which calibration would
    then fit into the profile as that processor's speed)."""
    from edgesplit.runtime import session as session_module
    from edgesplit.runtime.session import Session

    bundles = []
    for n in (1, 2):
        plan = contiguous_plan(conv_chain, "host-2core", [("core0", "ort"), ("core1", "ort")][:n])
        compile_bundle(conv_chain, plan, tmp_path / f"b{n}")
        bundles.append(str(tmp_path / f"b{n}"))
    calls: list[int] = []  # which bundle ran, by its number of parts
    real = Session.run

    def run(self, feeds):
        calls.append(len(self.manifest.parts))
        return real(self, feeds)

    monkeypatch.setattr(Session, "run", run)
    made = session_module.caller_run

    def counted(sess):  # a one-part ORT bundle's run is its own closure (runtime/caller.py)
        fast = made(sess)
        return lambda feeds, **kw: (calls.append(len(sess.manifest.parts)), fast(feeds, **kw))[1]

    monkeypatch.setattr(session_module, "caller_run", counted)
    assert TURNS >= 2
    runs, warmup = 9, 2
    got = measure_alternating(bundles, runs, warmup)
    assert {b: m.requests for b, m in got.items()} == dict.fromkeys(bundles, runs)
    assert all(set(m.part_ms) == {f"p{i}" for i in range(n)} for n, m in zip((1, 2), got.values()))
    assert calls.count(1) == calls.count(2) == warmup + TURNS + runs  # one untimed run per turn
    blocks = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]
    assert len(blocks) >= 2 * TURNS, blocks  # one block each would be [1, 2] after the warm-ups


@pytest.mark.slow  # measures a deployed bundle for seconds (8.6 s here)
def test_calibrate_command(conv_chain, tmp_path):
    device = load_device("host-2core")
    prof = profile_model(conv_chain, device, ProfileOptions(["ort"], runs=5, warmup=2))
    prof.save(tmp_path / "p.json")
    plan = partition(
        conv_chain,
        device,
        profile=str(tmp_path / "p.json"),
        pins={conv_chain.nodes[-1].name: "core1"},
    )
    compile_bundle(conv_chain, plan, tmp_path / "b")
    r = run_cli(
        "calibrate",
        str(tmp_path / "b"),
        "-o",
        str(tmp_path / "cal.json"),
        "--runs",
        "5",
        "--rounds",
        "2",
    )
    assert r.returncode == 0, r.stderr
    assert "round 1" in r.stdout and "fitted terms" in r.stdout
    cal = load_profile(tmp_path / "cal.json")
    assert len(cal.calibration["rounds"]) >= 1
    assert any(e.terms is not None and e.terms.calibrated for e in cal.entries)
    # a bundle whose plan names no profile needs --profile: one line, exit 2
    manual = contiguous_plan(conv_chain, "host-2core", [("core0", "ort"), ("core1", "ort")])
    compile_bundle(conv_chain, manual, tmp_path / "m")
    r = run_cli("calibrate", str(tmp_path / "m"), "-o", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "pass --profile" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(
        "calibrate",
        str(tmp_path / "m"),
        "-o",
        str(tmp_path / "x.json"),
        "--profile",
        str(tmp_path / "p.json"),
        "--runs",
        "3",
        "--rounds",
        "1",
    )
    assert r.returncode == 0, r.stderr
    # both bundles (one model, one device) fitted together: the first one's plan names the profile
    r = run_cli(
        "calibrate",
        str(tmp_path / "b"),
        str(tmp_path / "m"),
        "-o",
        str(tmp_path / "both.json"),
        "--runs",
        "5",
    )
    assert r.returncode == 0, r.stderr
    # the stream of m kept one of its workers busy: that worker's gap before a queued part is fitted
    assert "a busy worker's gap before a queued part" in r.stdout, r.stdout
    gaps = [e.terms.stream_gap_ms for e in load_profile(tmp_path / "both.json").entries if e.terms]
    assert any(g is not None and 0 < g < 5 for g in gaps), gaps
    both = load_profile(tmp_path / "both.json").calibration
    assert [Path(b).name for b in both["bundles"]] == ["b", "m"]
    for rnd in both["rounds"]:
        cases = {(Path(c["bundle"]).name, c["metric"]) for c in rnd["cases"]}
        # each bundle's latency; m (core0 then core1) streamed too, its period predicted
        assert {("b", "latency"), ("m", "latency"), ("m", "period")} <= cases, cases
    # the bundle must be signed by --trust-key, as for run; a tolerance must be a finite number
    from edgesplit.bundle.signing import generate_key

    _, public, _ = generate_key(tmp_path / "k")
    r = run_cli(
        "calibrate", str(tmp_path / "m"), "-o", str(tmp_path / "y.json"), "--trust-key", str(public)
    )
    assert r.returncode == 2 and "not signed" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(
        "calibrate", str(tmp_path / "m"), "-o", str(tmp_path / "y.json"), "--tolerance", "nan"
    )
    assert r.returncode == 2 and "not a finite number" in r.stderr
    assert not (tmp_path / "y.json").exists()


@pytest.mark.slow  # deploys, then measures the bundle (5.7 s here)
def test_a_deployed_bundle_calibrates_without_profiling_again(conv_chain, tmp_path):
    """``deploy`` without --profile keeps the profile it measured beside the bundle, and the
    bundle's plan names it: ``calibrate BUNDLE`` then refits it (it used to ask for --profile,
    that is, for profiling the model again)."""
    out = tmp_path / "dep.bundle"
    r = run_cli(
        "deploy",
        conv_chain.path,
        "--device",
        "host-2core",
        "-o",
        str(out),
        "--runs",
        "5",
        "--no-verify",
    )
    assert r.returncode == 0, r.stderr
    beside = tmp_path / "dep.profile.json"
    assert f"and its profile {beside}" in " ".join(r.stdout.split())
    kept = load_profile(beside)
    assert kept.model_sha256 == conv_chain.sha256
    assert {e.processor for e in kept.entries} == {"core0", "core1", "core0+core1"}
    plan = json.loads((out / "manifest.json").read_text())["plan"]
    assert plan["profile_path"] == str(beside)
    r = run_cli(
        "calibrate", str(out), "-o", str(tmp_path / "cal.json"), "--runs", "3", "--rounds", "1"
    )
    assert r.returncode == 0, r.stderr
    # one round: how the profile as measured did, not "not within 5% after 1 round(s)" (no round
    # after it could check the fitted terms, however close the profile was)
    said = " ".join(r.stdout.split())
    assert (
        "the profile as measured was" in said and "one round cannot check the fitted terms" in said
    )
    assert "after 1 round(s)" not in said
    assert load_profile(tmp_path / "cal.json").calibration["rounds"]
    # a profile given as a file stays where it is: nothing is written beside the bundle
    r = run_cli(
        "deploy", conv_chain.path, "--device", "host-2core", "-o", str(tmp_path / "again"),
        "--profile", str(beside), "--no-verify",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "again.profile.json").exists() and "its profile" not in r.stdout


# ---- a call to a server

LAB_SERVER = """\
name: lab-server
kind: server
description: this machine, serving over loopback, standing for a server
processors:
  cpu:
    kind: cpu
    peak_gflops: 20
    mem_bandwidth_gbps: 10
    active_w: 50
    idle_w: 10
    backends: [{runtime: ort}]
"""


def _call_ms(costs, k: int) -> float:
    """Part ``k``'s call as priced: from its first input leaving home to its last output back."""
    s = schedule(costs.cm, costs.assign, costs.parts)
    proc = s.part_proc[k]
    ins = [j for j, c in enumerate(s.crossings) if c.dst == proc]
    outs = [j for j, c in enumerate(s.crossings) if c.src == proc]
    return max(s.crossing_end_ms[j] for j in outs) - min(s.crossing_start_ms[j] for j in ins)


@pytest.mark.slow
@pytest.mark.measures
def test_a_server_call_is_fitted_from_calls_to_a_real_server(conv_chain, tmp_path):
    """The second half of the chain on a server (this machine over loopback, 400 kB each way): a
    call costs more than the link's time and the part's compute (this client and the server's HTTP
    handling). ``calibrate --server`` fits that cost from the calls, and the call is then priced as
    a fresh measurement of it finds it, where the profile as measured prices it short."""
    from edgesplit.serve.server import ServeOptions, ServerThread

    (tmp_path / "srv.yaml").write_text(LAB_SERVER)
    quick = ProfileOptions(["ort"], runs=5, warmup=2)
    server = read_spec(tmp_path / "srv.yaml").load(
        local=True
    )  # measured here, as profile --here does
    profile_model(conv_chain, server, quick).save(tmp_path / "srv.json")
    profile_model(
        conv_chain, load_device("host-2core"), replace(quick, processors=("core0",))
    ).save(tmp_path / "dev.json")
    half = len(conv_chain.nodes) // 2
    pins = {
        n.name: "core0" if i < half else "lab-server.cpu" for i, n in enumerate(conv_chain.nodes)
    }
    plan = partition(
        conv_chain,
        "host-2core",
        profile=str(tmp_path / "dev.json"),
        server=str(tmp_path / "srv.yaml"),
        server_profile=str(tmp_path / "srv.json"),
        link="wifi",
        bandwidth_mbps=20_000,
        rtt_ms=0.05,
        pins=pins,
    )
    assert [p.remote for p in plan.parts] == [False, True]
    compile_bundle(conv_chain, plan, tmp_path / "b")
    with ServerThread(tmp_path / "b", ServeOptions(port=0, all_parts=True)) as srv:
        result = refit(tmp_path / "b", runs=30, warmup=3, max_rounds=1, server_url=srv.url)
        fresh = measure(tmp_path / "b", runs=30, warmup=3, server_url=srv.url).remote["p1"]
    home = next(e.terms for e in result.profile.entries if e.processor == "core0")
    mb = (fresh.sent_nbytes + fresh.received_nbytes) / 1e6  # the HTTP bodies: tensors and headers
    fitted = home.remote_call_ms + home.remote_call_ms_per_mb * mb
    costs = plan_costs(plan, result.profile)
    link_ms = 2 * 0.05 / 2 + mb * 1e6 * 8 / 20_000e6 * 1e3  # the plan's link: half the RTT each way
    got = (
        fresh.call_ms - fresh.compute_ms - link_ms
    )  # what the call cost beyond the link and compute
    assert got > 0.2, fresh  # this client and the server's HTTP handling cost something
    # The call's own cost moves between 0.75 and 1.9 ms from one run of 30 calls to the next here
    # (client, server and ORT threads share 2 cores). A CI dry run fitted 1.58 against a fresh 0.75,
    # and CI fitted 1.94 against a fresh 1.35, so the fresh run only bounds the term's order: fitted
    # at all, and within twice a fresh call's own cost plus 0.5 ms. That the fit leaves the part's
    # compute out is checked exactly, on known calls, in
    # test_a_call_s_fixed_cost_and_cost_per_mb_are_recovered_from_two_payload_sizes.
    assert 0.2 < fitted < 2 * (fresh.call_ms - fresh.compute_ms) + 0.5, (fitted, got, fresh, home)
    # the call is charged on the server part's run, so the chain's call is priced that much longer
    # (for the tensors' 2 x 401408 bytes)
    fitted = home.remote_call_ms + home.remote_call_ms_per_mb * 2 * 401408 / 1e6
    no_call = replace(home, remote_call_ms=0.0, remote_call_ms_per_mb=0.0)
    entries = [replace(e, terms=no_call) if e.terms == home else e for e in result.profile.entries]
    before = _call_ms(plan_costs(plan, replace(result.profile, entries=tuple(entries))), 1)
    # the hand-offs around the call are priced by the idle gap before them, which the call's
    # length moves: a few microseconds (2.8 us in one CI dry run)
    assert _call_ms(costs, 1) - before == pytest.approx(fitted, abs=0.01)
    # and again from the profile file, as partition --profile reads it
    result.profile.save(tmp_path / "cal.json")
    assert load_profile(tmp_path / "cal.json").entries == result.profile.entries
