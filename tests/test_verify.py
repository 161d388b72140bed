"""Verification by measurement (issue 10 item 4): ``deploy`` measures the plan against the best
baselines on this machine, alternating between them, and ships the measured winner.

The device here is this machine's two cores as ``big`` and a ``little`` one throttled to 20% (five
times slower), so that a plan pinned to ``little`` is *much* worse than the whole model on ``big``:
the verdict is then robust on a noisy shared machine. No other timing is asserted.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import make_model, rand
from onnx import helper

import edgesplit
from edgesplit.bundle.format import Manifest, open_bundle
from edgesplit.bundle.verdict import MeasuredCandidate, Verification
from edgesplit.cli.main import main
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.workflows.deploy import verify_options_for
from edgesplit.workflows.verify.measure import MIN_ROUNDS

SPEC = """\
name: verifyboard
kind: device
description: core 0 as big, core 1 throttled to 20% as little, and a processor without Relu
local: true
processors:
  big:
    kind: cpu
    cores: [0]
    threads: 1
    peak_gflops: 100
    mem_bandwidth_gbps: 10
    active_w: 3.5
    idle_w: 1.2
    backends:
      - runtime: ort
  little:
    kind: cpu
    cores: [1]
    threads: 1
    cpu_quota_pct: 20
    peak_gflops: 20
    mem_bandwidth_gbps: 10
    active_w: 1.0
    idle_w: 0.4
    backends:
      - runtime: ort
  norelu:
    kind: cpu
    cores: [0]
    threads: 1
    ops: {exclude: [Relu]}
    peak_gflops: 1
    mem_bandwidth_gbps: 1
    active_w: 3.0
    idle_w: 1.0
    backends:
      - runtime: ort
"""
BUDGET_S = 15.0
# For tests of what is measured and reported, not of which candidate wins: a few rounds are enough.
QUICK_BUDGET_S = 4.0
# Throughput's rounds are streams: warming up plus one round of them was estimated over 4 s, and
# then over 8 s, while the other worker ran tests (CI dry runs, 2026-12-04: "not enough time to
# verify"); it gets the full budget.
STREAM_BUDGET_S = BUDGET_S


def _chain(path: Path, n_convs: int = 6, ch: int = 32, hw: int = 48) -> Path:
    """Conv/Relu x n on 1 x ch x hw x hw, then pool and a classifier: a few ms on one core."""
    nodes, weights, x = [], [], "x"
    for i in range(n_convs):
        weights += [(f"w{i}", rand(ch, ch, 3, 3, seed=i)), (f"b{i}", rand(ch, seed=100 + i))]
        nodes += [
            helper.make_node(
                "Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"
            ),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    weights += [("wf", rand(10, ch, seed=7)), ("bf", rand(10, seed=8))]
    import onnx

    onnx.save(make_model(nodes, [("x", [1, ch, hw, hw])], [("y", [1, 10])], weights), path)
    return path


def _setup(root: Path, processors: tuple[str, ...]):
    model = _chain(root / "chain.onnx")
    spec = root / "verifyboard.yaml"
    spec.write_text(SPEC)
    graph = load_model(str(model))
    prof = profile_model(
        graph, edgesplit.load_device(spec), ProfileOptions(("ort",), processors, 5, 2)
    )
    prof_path = root / "chain.profile.json"
    prof.save(prof_path)
    return model, spec, prof_path, [n.name for n in graph.nodes]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The model, the device spec, and a profile of big and little measured once (norelu
    predicted)."""
    return _setup(tmp_path_factory.mktemp("verify"), ("big", "little"))


@pytest.fixture(scope="module")
def setup_big(tmp_path_factory):
    """As ``setup``, with only big measured (little, throttled and slow to profile, predicted): for
    the tests that measure no candidates."""
    return _setup(tmp_path_factory.mktemp("verify_big"), ("big",))


def _deploy(setup, out: Path, on: str | None, few_rounds: bool = False, **kw) -> Manifest:
    """Deploy with every node on ``on``. ``few_rounds``: measure the fewest rounds that give a
    verdict (``MIN_ROUNDS``) rather than as many as fit the budget, for the tests of what is
    measured
    and reported rather than of which candidate wins (the budget still bounds a slow round)."""
    model, spec, prof, nodes = setup
    pins = {n: on for n in nodes} if on else None
    kw.setdefault("verify_budget_s", BUDGET_S)
    if few_rounds:
        options = verify_options_for(kw.pop("verify_budget_s"), kw.pop("server_url", None), None)
        kw["verify_options"] = replace(options, max_rounds=MIN_ROUNDS)
    return edgesplit.deploy(model, spec, out, profile=prof, pins=pins, **kw)


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
@pytest.mark.measures
def test_a_plan_much_worse_than_a_baseline_is_replaced_by_it(setup, tmp_path):
    """Every node pinned to the little core (5x slower): the whole model on big is shipped."""
    out = tmp_path / "bundle"
    m = _deploy(setup, out, "little", few_rounds=True)  # 5x slower: the fewest rounds decide it
    v = m.verification
    assert v is not None and v.metric == "latency"
    assert v.shipped == "only:big" and not v.kept_plan, v.reason
    assert "only:big" in v.reason, v.reason
    assert v.rounds >= 3 and v.plan_ratio_high is not None and v.plan_ratio_high >= 1
    # the bundle at -o is the baseline's, and says why
    shipped = open_bundle(out)
    assert {p.processor for p in shipped.parts} == {"big"} and len(shipped.parts) == 1
    assert shipped.verification == v  # the verdict round-trips through manifest.json
    assert shipped.plan.solver.name == "baseline:only:big"
    plan, big = v.candidate("plan"), v.candidate("only:big")
    assert plan.measured_ms > big.measured_ms and big.ratio_to_best == 1.0
    assert plan.n_parts == 1 and len(plan.rounds_ms) == v.rounds
    # the plan *is* the whole model on little: that candidate is the plan's measurement, not a
    # second one
    assert v.candidate("only:little").same_as == "plan"
    # a candidate that cannot be built is listed with the reason, not dropped
    norelu = v.candidate("only:norelu")
    assert norelu.error and "Relu" in norelu.error and not norelu.measured
    assert not list(tmp_path.glob(".bundle.verify.*"))  # the candidates' bundles are cleaned up


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
def test_a_plan_that_is_the_best_single_processor_is_kept_and_measured_once(setup, tmp_path):
    m = _deploy(setup, tmp_path / "bundle", "big", few_rounds=True)
    v = m.verification
    assert v.shipped == "plan" and v.kept_plan
    assert "the plan is only:big" in v.reason
    big = v.candidate("only:big")
    assert big.same_as == "plan"
    assert big.rounds_ms == v.candidate("plan").rounds_ms  # one measurement, shown under both names
    assert v.candidate("only:little").measured
    assert m.plan.solver.name != "baseline:only:big"  # the optimiser's own plan was shipped


@pytest.mark.slow
def test_a_tiny_budget_keeps_the_plan_and_says_so(setup_big, tmp_path):
    m = _deploy(setup_big, tmp_path / "bundle", "little", verify_budget_s=0.001)
    v = m.verification
    assert v.shipped == "plan" and v.kept_plan and v.rounds == 0
    assert "not enough time to verify" in v.reason
    assert {p.processor for p in open_bundle(tmp_path / "bundle").parts} == {"little"}


def test_rounds_and_turns_fit_the_budget():
    from edgesplit.workflows.verify.measure import _Bench, _choose

    class _Sess:
        class manifest:  # noqa: N801 - a stand-in with the one attribute read
            parts = (1, 2)

    benches = [
        _Bench("a", _Sess(), "latency", warm_ms=10.0),
        _Bench("b", _Sess(), "latency", warm_ms=50.0),
    ]
    for budget_s in (0.2, 0.5, 1.0, 3.0, 30.0):
        rounds, k = _choose(benches, budget_s, "latency", 3, 9)
        if rounds:
            assert 1 <= rounds <= 9 and k >= 1
            assert rounds * sum(b.turn_cost_ms(k) for b in benches) / 1e3 <= budget_s
            if rounds < 3:
                assert k == 1 and 3 * sum(b.turn_cost_ms(1) for b in benches) / 1e3 > budget_s
        else:
            assert sum(b.turn_cost_ms(1) for b in benches) / 1e3 > budget_s
    # a turn of one request: its pause (0.1 s) and the request (0.01 s and 0.05 s)
    assert _choose(benches, 0.25, "latency", 3, 9) == (0, 0)
    assert _choose(benches, 0.3, "latency", 3, 9) == (1, 1)
    # a turn of k requests: k pauses and k requests
    assert benches[0].turn_cost_ms(5) == pytest.approx(5 * 110.0)
    assert _choose(benches, 30.0, "latency", 3, 9)[0] == 9


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
def test_no_verify_skips_and_the_cli_prints_the_table(setup, tmp_path, capsys):
    model, spec, prof, nodes = setup
    pins = [a for n in nodes for a in ("--pin", f"{n}=big")]
    args = ["deploy", str(model), "-d", str(spec), "--profile", str(prof), *pins]

    def run(*extra: str) -> tuple[int, str]:
        with pytest.raises(SystemExit) as e:
            main([*args, *extra])
        out, err = capsys.readouterr()
        return e.value.code, out + err

    code, out = run("--no-verify", "-o", str(tmp_path / "a"))
    assert code == 0 and "not verified (--no-verify)" in out
    assert open_bundle(tmp_path / "a").verification is None
    code, out = run("--verify-budget-s", str(QUICK_BUDGET_S), "-o", str(tmp_path / "b"))
    assert code == 0, out
    assert "verification on this device" in out and "measured median ms" in out
    # the core group of the three CPU processors (plain ORT's) is predicted too: it was not profiled
    costs = next(line for line in out.splitlines() if line.startswith("costs:"))
    assert "measured big/ort, little/ort" in costs and "predicted by the spec's roofline" in costs
    assert "norelu/ort" in costs.split("roofline")[1], costs
    # Which candidate wins is for the `measures` tests (another worker may load big's core here):
    # this one checks that the verdict the bundle records is printed.
    v = open_bundle(tmp_path / "b").verification
    assert v.candidate("only:big").same_as == "plan"
    assert f"shipped {v.shipped}: {v.reason[:24]}" in out
    code, out = run("--verify-budget-s", "0", "-o", str(tmp_path / "c"))
    assert code == 2 and "--verify-budget-s" in out


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
def test_remote_candidates_are_skipped_without_a_server_url_and_measured_with_one(setup, tmp_path):
    def deploy(name: str, **kw) -> Manifest:  # all on big, with the A100 over Wi-Fi
        kw = dict(server="server-a100", link="wifi", verify_budget_s=QUICK_BUDGET_S, **kw)
        return _deploy(setup, tmp_path / name, "big", few_rounds=True, **kw)

    v = deploy("a").verification
    assert "no server URL" in v.candidate("server-only").error
    cut = v.candidate(
        "best-single-cut"
    )  # over Wi-Fi the best cut may keep every node on the device
    # (the device's part on its fastest whole-model processor, whichever the profile found that to
    # be)
    assert (cut.error and "no server URL" in cut.error) or cut.same_as in (
        "plan",
        "only:big",
        "only:little",
    )
    assert any("no server URL was given" in n for n in v.notes)
    # a candidate that was not measured is never shipped (which of the measured ones is, is not
    # this test's: it runs beside the other worker, and a full-suite run on 2026-12-05 measured
    # the plan on big slower than only:little there)
    assert v.shipped not in ("server-only", "best-single-cut") and v.candidate(v.shipped).measured
    row = deploy("b", server_url="local").verification.candidate("server-only")
    assert row.error is None and row.measured and row.n_parts == 1
    # a running server at a URL: measured where it serves the candidate's parts (bundle "a" is the
    # whole model as one part p0, as server-only's is), else listed with the reason
    from edgesplit.serve.server import ServeOptions, ServerThread

    with ServerThread(tmp_path / "a", ServeOptions(port=0, all_parts=True)) as srv:
        m = deploy("c", server_url=srv.url)
    assert m.verification.candidate("server-only").measured
    nodes = setup[3]
    split = {
        n: "big" if i < 6 else "little" for i, n in enumerate(nodes)
    }  # its p0 is the first 6 nodes
    edgesplit.deploy(
        setup[0], setup[1], tmp_path / "split", profile=setup[2], pins=split, verify=False
    )
    with ServerThread(tmp_path / "split", ServeOptions(port=0, all_parts=True)) as srv:
        m = deploy("d", server_url=srv.url)
    assert "serves another part p0" in m.verification.candidate("server-only").error


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
def test_the_objective_decides_the_metric(setup, tmp_path):
    v = _deploy(
        setup,
        tmp_path / "t",
        "big",
        few_rounds=True,
        objective="throughput",
        verify_budget_s=STREAM_BUDGET_S,
    )
    v = v.verification
    assert v.metric == "throughput", v.reason
    assert v.candidate("only:little").measured, v.reason
    # the candidates are priced by the stream's period: the shipped one's figure is its bundle's
    # period (which one is shipped is not this test's: a CI dry run on 2026-12-05 shipped
    # only:little)
    shipped = "plan" if v.kept_plan else v.shipped
    assert v.candidate(shipped).predicted_ms == pytest.approx(
        open_bundle(tmp_path / "t").plan.predicted.period_ms, rel=1e-6
    ), (v.reason, v.candidates)
    v = _deploy(
        setup,
        tmp_path / "e",
        "big",
        few_rounds=True,
        objective="energy",
        verify_budget_s=QUICK_BUDGET_S,
    )
    v = v.verification
    assert v.metric == "energy" and any("energy is modelled" in n for n in v.notes)
    assert all(c.energy_mj is not None for c in v.candidates if c.measured)


def test_the_verdict_round_trips_and_older_manifests_read():
    v = Verification(
        metric="latency",
        shipped="only:big",
        kept_plan=False,
        reason="r",
        candidates=(
            MeasuredCandidate("plan", "s", 3, 1.0, 2.0, 5.0, 2.0, None, (2.0, 2.1, 1.9)),
            MeasuredCandidate("only:big", "s", 1, 1.1, 1.0, 4.0, 1.0, same_as=None),
            MeasuredCandidate("only:x", "s", error="cannot run 2 of 9 nodes (Relu)"),
        ),
        rounds=3,
        requests_per_turn=5,
        budget_s=30.0,
        measure_s=1.5,
        plan_ratio_low=1.9,
        plan_ratio_high=2.1,
        notes=("n",),
    )
    d = json.loads(json.dumps(v.to_json()))
    assert Verification.from_json(d) == v
    d["a_newer_key"] = 1
    d["candidates"][0]["another"] = "x"
    del d["notes"]
    assert Verification.from_json(d).candidates == v.candidates  # tolerant both ways
    assert v.candidate("only:x").error and not v.candidate("only:x").measured


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
@pytest.mark.measures
def test_compile_verify_measures_a_saved_plan(setup, tmp_path, capsys):
    """``compile --verify`` loads the plan's problem again (model, spec, profile) and verifies
    it."""
    model, spec, prof, nodes = setup
    plan = edgesplit.partition(model, spec, profile=prof, pins={n: "little" for n in nodes})
    plan.save(tmp_path / "plan.json")
    args = ["compile", str(model), "--plan", str(tmp_path / "plan.json"), "-o", str(tmp_path / "b")]
    with pytest.raises(SystemExit) as e:
        main([*args, "--verify", "--verify-budget-s", str(BUDGET_S)])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    assert "verification on this device" in out and "shipped only:big: the plan is" in out
    assert open_bundle(tmp_path / "b").verification.shipped == "only:big"
    with pytest.raises(SystemExit) as e:
        main([*args[:-1], str(tmp_path / "c")])
    assert (
        e.value.code == 0 and open_bundle(tmp_path / "c").verification is None
    )  # no --verify: as before


def test_the_rule_keeps_the_plan_only_when_faster_in_every_round():
    """The decision on given figures (no measuring): paired per-round ratios against the best
    other."""
    from edgesplit.workflows.verify.decide import decide

    def row(name, rounds, **kw):
        return MeasuredCandidate(
            name, "", 1, None, sorted(rounds)[len(rounds) // 2], rounds_ms=tuple(rounds), **kw
        )

    big, little = row("only:big", [10, 12, 11]), row("only:little", [30, 31, 29])
    assert decide([row("plan", [9, 11, 10]), big, little], "latency", None)[0] == "plan"
    shipped, reason, low, high = decide([row("plan", [9, 13, 10]), big, little], "latency", None)
    assert shipped == "only:big" and "beyond the noise" in reason and low < 1 < high
    assert decide([row("plan", [20, 22, 21]), big, little], "latency", None)[1].startswith(
        "the plan is slower"
    )
    same = row("only:big", [10, 12, 11], same_as="plan")
    assert decide([row("plan", [10, 12, 11]), same, little], "latency", None)[0] == "plan"
    failed = MeasuredCandidate("plan", "", 3, error="cannot run: boom")
    assert decide([failed, big, little], "latency", None)[0] == "only:big"
    assert decide([row("plan", [50, 50, 50]), big], "latency", "not enough time")[0] == "plan"
    assert (
        decide(
            [row("plan", [9, 11, 10]), MeasuredCandidate("only:x", "", error="e")], "latency", None
        )[0]
        == "plan"
    )
    # fewer rounds than the minimum (a small budget): a verdict, but the plan is not kept on it
    shipped, reason, _, _ = decide(
        [row("plan", [9]), row("only:big", [10]), little], "latency", None
    )
    assert shipped == "only:big" and "fewer than the 3 needed" in reason


def test_a_latency_tie_goes_to_the_plan_only_when_it_spends_clearly_less_energy():
    """Level within the noise (neither faster in every round, the plan's median per-round ratio
    at most 1.02): the plan is kept when its modelled energy is at least 10% lower than the best
    other's, and named as such; a costlier or barely cheaper plan, a plan slower by median, or
    another metric, leaves the baseline shipped."""
    from edgesplit.workflows.verify.decide import decide

    def row(name, rounds, mj, **kw):
        return MeasuredCandidate(
            name, "", 1, None, sorted(rounds)[1], rounds_ms=tuple(rounds), energy_mj=mj,
            **kw,
        )  # fmt: skip

    plain = row("plain-ort", [10.0, 12.0, 11.0], 2.0)
    shipped, reason, low, high = decide(
        [row("plan", [11.0, 11.0, 10.5], 1.2), plain], "latency", None
    )
    assert shipped == "plan" and low < 1 < high
    assert "level with plain-ort within the noise" in reason and "40% lower" in reason
    for plan in (
        row("plan", [11.0, 11.0, 10.5], 1.9),  # 5% less: not clearly
        row("plan", [9.5, 13.0, 12.0], 1.2),  # slower by median (1.08), faster in one round
        row("plan", [11.0, 11.0, 10.5], None),  # nothing modelled
    ):
        assert decide([plan, plain], "latency", None)[0] == "plain-ort"
    tput = decide([row("plan", [11.0, 11.0, 10.5], 1.2), plain], "throughput", None)
    assert tput[0] == "plain-ort"


@pytest.mark.slow  # measures candidates for seconds (the verification budget)
def test_a_verified_bundle_is_signed_with_its_verdict_and_refuses_a_foreign_output(setup, tmp_path):
    """Main's hardening holds with verification: ``-o`` onto a folder of other files is refused
    before anything is measured, and ``--sign-key`` signs the manifest the verdict is in."""
    from edgesplit.bundle.format import open_verified
    from edgesplit.bundle.signing import generate_key
    from edgesplit.errors import BundleError

    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"x")
    with pytest.raises(BundleError, match="photos"):
        _deploy(setup, foreign, "little")
    assert (foreign / "cat.jpg").exists() and not list(tmp_path.glob(".photos.verify.*"))
    private, public, _ = generate_key(tmp_path / "key")
    out = tmp_path / "signed"
    m = _deploy(setup, out, "little", few_rounds=True, sign_key=private)
    vb = open_verified(out, trust_key=public)
    assert vb.trusted_key is not None and vb.manifest.verification == m.verification
    assert m.verification.shipped == "only:big"


def test_a_manifest_with_a_hostile_verdict_is_refused(setup_big, tmp_path):
    """The verdict is read as strictly as the rest of the manifest: a negative or non-numeric
    figure is a one-line BundleError naming the manifest, never a crash later."""
    from edgesplit.errors import BundleError

    out = tmp_path / "b"
    _deploy(setup_big, out, "big", verify=False)
    raw = json.loads((out / "manifest.json").read_text())
    for bad in ({"measured_ms": -1.0}, {"rounds_ms": ["fast"]}, {"name": 3}):
        cand = {"name": "plan", "summary": "s", "measured_ms": 1.0, **bad}
        raw["verification"] = {
            "metric": "latency",
            "shipped": "plan",
            "kept_plan": True,
            "reason": "r",
        }
        raw["verification"]["candidates"] = [cand]
        with pytest.raises(BundleError, match="manifest.json"):
            Manifest.from_json(raw, str(out / "manifest.json"))


def test_one_slow_warm_up_is_looked_at_again_before_giving_up(monkeypatch, tmp_path):
    """A candidate's first timed run was slow (the machine was busy for a moment): its estimate says
    no round fits the budget. The verifier times it once more and takes the faster, and measures,
    rather than giving up with most of the budget left."""
    import edgesplit.workflows.verify.measure as vm

    class Busy:
        """A Session whose first timed run (its second) takes 0.3 s, and every other 1 ms."""

        def __init__(self):
            self.calls = 0

        def run(self, feeds):
            self.calls += 1
            time.sleep(0.3 if self.calls == 2 else 0.001)
            return {}

        def close(self):
            pass

    monkeypatch.setattr(vm, "load", lambda path, executor_options=None: Busy())
    monkeypatch.setattr(vm, "random_feeds", lambda session: {})
    m = vm.measure({"plan": tmp_path / "a", "only:big": tmp_path / "b"}, "latency", 1.5)
    assert m.short is None and m.rounds >= 1 and not m.errors, m


def test_a_race_stops_the_clearly_slower_and_gives_its_time_to_the_close_ones(
    monkeypatch, tmp_path
):
    """Four bundles: the plan and a baseline as fast as it (2 ms a request), one 3x slower and one
    4x faster that misses the accuracy budget (not in the race's pace). After the minimum rounds the
    slow one stops; the time it would have taken goes to more rounds of the others, up to the most
    allowed. The fast inaccurate one sets no pace, so nothing else stops."""
    import edgesplit.workflows.verify.measure as vm

    class Sleeper:
        def __init__(self, s: float):
            self.s = s

        def run(self, feeds):
            time.sleep(self.s)
            return {}

        def close(self):
            pass

    took = {"plan": 0.002, "near": 0.002, "slow": 0.006, "inaccurate": 0.0005}
    monkeypatch.setattr(
        vm, "load", lambda path, executor_options=None: Sleeper(took[Path(path).name])
    )
    monkeypatch.setattr(vm, "TURN_PAUSE_S", 0.0)  # sleepers have no threads to quieten
    monkeypatch.setattr(vm, "random_feeds", lambda session: {})
    bundles = {n: tmp_path / n for n in took}
    m = vm.measure(bundles, "latency", 0.8, max_rounds=40, race={"plan", "near", "slow"})
    assert m.short is None and not m.errors, m
    assert m.stopped == {"slow": vm.MIN_ROUNDS}, m.stopped
    assert len(m.rounds_ms["slow"]) == vm.MIN_ROUNDS
    # the others took every round, more than all four could have had in the budget
    per_round_s = sum(took.values()) * vm.TURN_REQUESTS["latency"][1]
    assert m.rounds > 0.8 / per_round_s, (m.rounds, per_round_s)
    assert {len(m.rounds_ms[n]) for n in ("plan", "near", "inaccurate")} == {m.rounds}
    # unraced, every bundle takes every round
    plain = vm.measure(bundles, "latency", 0.3, max_rounds=40)
    assert not plain.stopped and len({len(v) for v in plain.rounds_ms.values()}) == 1


def test_each_timed_request_starts_after_the_pause(monkeypatch, tmp_path):
    """Every timed latency request comes at least ``TURN_PAUSE_S`` after the request before it,
    its own bundle's or another's (the threads of the one before go quiet): a request alone, as
    ``benchmarks/honest_baselines.py`` measures the shipped bundle against plain ORT."""
    import edgesplit.workflows.verify.measure as vm

    runs: list[tuple[str, float, float]] = []

    class Stamper:
        def __init__(self, name: str):
            self.name = name

        def run(self, feeds):
            t0 = time.perf_counter()
            time.sleep(0.001)
            runs.append((self.name, t0, time.perf_counter()))
            return {}

        def close(self):
            pass

    monkeypatch.setattr(vm, "load", lambda path, executor_options=None: Stamper(Path(path).name))
    monkeypatch.setattr(vm, "random_feeds", lambda session: {})
    m = vm.measure({n: tmp_path / n for n in ("a", "b")}, "latency", 3.0, max_rounds=4)
    assert m.rounds >= 3 and m.requests_per_turn >= 2
    timed = runs[4:]  # after the warm-up's two requests each
    assert len(timed) == 2 * m.rounds * m.requests_per_turn
    pairs = list(zip(timed, timed[1:]))
    assert all(y[1] - x[2] >= vm.TURN_PAUSE_S * 0.95 for x, y in pairs)
    assert runs[4][1] - runs[3][2] >= vm.TURN_PAUSE_S * 0.95  # the first too


def test_each_candidate_is_called_from_a_thread_of_its_own(monkeypatch, tmp_path):
    """Every request of a candidate, warm-up and rounds, comes from that candidate's own thread,
    never the verifying thread or another candidate's (a candidate on the big core keeps its
    caller pinned there: from one shared thread, the next candidate started on the big core)."""
    import threading

    import edgesplit.workflows.verify.measure as vm

    threads: dict[str, set[int]] = {}

    class Recorder:
        def __init__(self, name: str):
            self.name = name

        def run(self, feeds):
            threads.setdefault(self.name, set()).add(threading.get_ident())
            return {}

        def close(self):
            pass

    monkeypatch.setattr(vm, "load", lambda path, executor_options=None: Recorder(Path(path).name))
    monkeypatch.setattr(vm, "random_feeds", lambda session: {})
    monkeypatch.setattr(vm, "TURN_PAUSE_S", 0.0)
    m = vm.measure({n: tmp_path / n for n in ("a", "b", "c")}, "latency", 0.5, max_rounds=3)
    assert m.rounds == 3 and not m.errors, m
    assert all(len(t) == 1 for t in threads.values()), threads
    ids = [next(iter(t)) for t in threads.values()]
    assert len(set(ids)) == 3 and threading.get_ident() not in ids


def test_the_verdict_pairs_a_plan_with_fewer_rounds_by_round():
    """A raced plan stopped after 3 rounds (slower in each); the best baseline took 9: the plan is
    compared with the baseline's first 3 rounds, and the baseline is shipped."""
    from edgesplit.bundle.verdict import MeasuredCandidate
    from edgesplit.workflows.verify.decide import decide

    plan = MeasuredCandidate("plan", "p", 2, 10.0, measured_ms=13.0, rounds_ms=(13.0, 12.5, 13.5))
    base = MeasuredCandidate("plain-ort", "b", 1, 10.0, measured_ms=10.0, rounds_ms=(10.0,) * 9)
    shipped, reason, low, high = decide([plan, base], "latency", None)
    assert shipped == "plain-ort" and low == 1.25 and high == 1.35, reason
    assert "over 3 rounds" in reason
