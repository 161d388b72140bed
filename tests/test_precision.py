"""Precision per processor (issue 11): int8 QDQ and fp16 parts, measured against fp32, under a
budget. Real ONNX Runtime quantization and runs throughout; the profile of the budget tests is
written in code so that the plan's shape (three int8 parts) does not depend on a noisy machine."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import make_model, max_examples, rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper
from precision_kit import ALLOWED, NPU_SPEC, made_up_profile, noisy_tail_chain, split_net_model

import edgesplit
import edgesplit.precision.measure
from edgesplit.errors import DeviceSpecError, InputError, PlanError
from edgesplit.model.calibration_data import calibration_set, image_layout
from edgesplit.optimize.accuracy import with_precisions
from edgesplit.optimize.planner import solve_plan
from edgesplit.precision.convert import calibrate, convert
from edgesplit.precision.measure import PlanMeasurer
from edgesplit.precision.metrics import SNR_CAP_DB, AccuracyBudget, compare
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile, Profile
from edgesplit.runtime.accuracy import bundle_accuracy
from edgesplit.workflows.resolve import Choices, resolve


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory):
    """One private EDGESPLIT_CACHE for the module: the calibration ranges of a model and data set
    are
    computed once and shared by its tests (the user's cache is never touched)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _cache(_module_cache, monkeypatch):
    monkeypatch.setenv("EDGESPLIT_CACHE", str(_module_cache))


@pytest.fixture
def split_net(tmp_path):
    model = split_net_model(tmp_path / "split.onnx")
    (tmp_path / "npu.yaml").write_text(NPU_SPEC)
    return edgesplit.load_model(model), edgesplit.load_device(tmp_path / "npu.yaml")


def _int8_nodes(plan) -> set[str]:
    return {n for p in plan.parts if p.precision == "int8" for n in p.nodes}


def test_an_int8_part_meets_the_stated_snr_against_fp32(split_net):
    """Static QDQ, per-channel weights, calibrated on photographs: the conv block in int8 keeps
    24 dB of SNR on held-out samples (measured here 25.0 dB with the photographs resized by Pillow's
    bilinear filter, 25.1 dB with scikit-image's Gaussian and spline, 24.5 dB with Lanczos: the
    bound leaves 1 dB for the resize and ORT's kernels, not more)."""
    graph, _ = split_net
    data = calibration_set(graph)
    assert data.source == "photos" and len(data.held_out) >= 8 and image_layout(graph) is not None
    ranges = calibrate(graph, data)
    assert calibrate(graph, data) == ranges and ranges.is_file()  # cached by model and data hash
    part = ["conv1", "relu1", "conv2"]
    model = edgesplit.precision.measure.part_model(graph, ["x"], ["c2"], "int8", ranges)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
    q = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = [{"c2": _tensor(graph, "c2", s)} for s in data.held_out]
    got = [{"c2": q.run(None, dict(s))[0]} for s in data.held_out]
    acc = compare(ref, got)
    assert acc.snr_db >= 24.0 and acc.cosine > 0.99, acc.summary()
    assert set(part) <= {n.name for n in graph.nodes}


def _tensor(graph, name, sample):
    probe = onnx.ModelProto()
    probe.CopyFrom(graph.model)
    probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run([name], dict(sample))[0]


@pytest.fixture
def problem(split_net):
    graph, device = split_net
    return resolve(graph, device, Choices(profile=made_up_profile(graph, device)))


def _solve(problem, budget):
    return solve_plan(
        dataclasses.replace(problem, accuracy=dataclasses.replace(problem.accuracy, budget=budget))
    )


def test_an_op_outside_the_allowlist_never_lands_on_the_npu(problem):
    plan = _solve(problem, AccuracyBudget(min_snr_db=-SNR_CAP_DB))  # a budget that takes any int8
    on_npu = {n for p in plan.parts if p.processor == "npu" for n in p.nodes}
    ops = {n.name: n.op_type for n in problem.graph.nodes}
    assert on_npu and {ops[n] for n in on_npu} <= ALLOWED
    assert (
        plan.assignment["hsig"]["processor"] == "cpu"
        and plan.assignment["div"]["processor"] == "cpu"
    )
    assert all(p.precision == ("int8" if p.processor == "npu" else "fp32") for p in plan.parts)
    assert len([p for p in plan.parts if p.precision == "int8"]) == 3
    with pytest.raises(PlanError, match="cannot run HardSigmoid"):
        solve_plan(dataclasses.replace(problem, pins={"hsig": "npu"}))


def test_the_real_profiler_measures_int8_and_leaves_unlisted_ops_unsupported(split_net):
    graph, device = split_net
    prof = edgesplit.profile_model(graph, device, edgesplit.ProfileOptions(runs=3, warmup=1))
    npu = prof.entry("npu", "ort-int8")
    assert npu.source == "measured" and set(npu.unsupported) == {"hsig", "div"}
    assert set(npu.nodes) == {n.name for n in graph.nodes} - {"hsig", "div"}
    assert "quantize" in npu.note and npu.dispatch_ms > 0
    assert npu.edge_in_ms_per_mb > 0 and npu.edge_out_ms_per_mb > 0  # Q/DQ at part edges, measured
    assert prof.entry("cpu", "ort").edge_in_ms_per_mb is None
    assert sum(c.latency_ms for c in npu.nodes.values()) > 0
    plan = edgesplit.partition(
        graph, device, profile=prof, accuracy=AccuracyBudget(min_snr_db=-SNR_CAP_DB)
    )
    assert all(plan.assignment[n]["processor"] == "cpu" for n in ("hsig", "div"))


BUDGETS = st.floats(min_value=0.0, max_value=60.0, allow_nan=False)


@settings(
    max_examples=max_examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(a=BUDGETS, b=BUDGETS)
def test_tightening_the_budget_never_adds_int8_parts(problem, a, b):
    """Over random pairs of SNR budgets: the tighter one's int8 nodes are a subset of the looser
    one's, and each plan meets its budget as measured."""
    loose, tight = sorted((a, b))
    p_loose, p_tight = (_solve(problem, AccuracyBudget(min_snr_db=x)) for x in (loose, tight))
    assert _int8_nodes(p_tight) <= _int8_nodes(p_loose)
    for plan, x in ((p_loose, loose), (p_tight, tight)):
        if plan.accuracy is not None:
            assert plan.accuracy.measured.snr_db >= x or not _int8_nodes(plan)


def test_a_tight_budget_drops_int8_parts_least_valuable_first(problem):
    first = _solve(problem, AccuracyBudget(min_snr_db=-SNR_CAP_DB))
    exact = _solve(problem, AccuracyBudget(min_snr_db=SNR_CAP_DB))
    assert len(_int8_nodes(first)) > 0 and _int8_nodes(exact) == set()
    dropped = exact.accuracy.dropped
    assert len(dropped) >= 1 and all("SNR" in d.why for d in dropped)
    assert exact.accuracy.measured.snr_db == SNR_CAP_DB  # fp32 parts reproduce the model
    # ORT's own assignment would run every NPU node in int8: the restricted one priced here says so
    (greedy,) = [b for b in exact.baselines if b.name == "ort-greedy"]
    assert "only where the budget keeps it" in greedy.assignment_summary
    (untouched,) = [b for b in first.baselines if b.name == "ort-greedy"]
    assert "budget" not in untouched.assignment_summary


def test_measuring_the_units_of_a_plan_that_misses_the_budget_reports_progress(split_net):
    """Each drop measures every unit alone (minutes on a big model): the caller's progress hears
    each unit before it is measured and the end of each drop's measuring."""
    from edgesplit.optimize.accuracy import PROGRESS_LABEL

    graph, device = split_net
    seen = []
    choices = Choices(
        profile=made_up_profile(graph, device), accuracy=AccuracyBudget(min_snr_db=SNR_CAP_DB)
    )
    plan = solve_plan(resolve(graph, device, choices, progress=lambda *a: seen.append(a)))
    drops = plan.accuracy.dropped
    assert drops and {label for label, _, _ in seen} == {PROGRESS_LABEL}
    rounds, current = [], []
    for _, done, total in seen:
        current.append(done)
        if done == total:
            rounds.append((current, total))
            current = []
    assert not current and len(rounds) == len(drops)
    assert all(done == list(range(total + 1)) for done, total in rounds)


def test_units_measured_alone_one_after_another_reuse_the_parts_they_begin_with(problem):
    """The planner measures each int8 unit alone, the rest in fp32, in the plan's order: a
    measurement takes the outputs of the parts that the last one on that sample began with, and
    gives exactly the outputs of running every part (counted: each runs from the first part that
    differs from the one before's)."""
    from edgesplit.optimize.accuracy import _alone, reduced

    plan = _solve(problem, AccuracyBudget(min_snr_db=-SNR_CAP_DB))
    measurer = PlanMeasurer(problem.graph)
    samples = measurer.data.held_out
    cases = [list(plan.parts)] + [_alone(plan, u, problem.graph) for u in reduced(plan)]
    assert len(cases) == 4 and all(len(c) == len(plan.parts) for c in cases)
    runs = []
    real_session = measurer._session

    def counted(*key):
        sess = real_session(*key)
        return SimpleNamespace(run=lambda *a: runs.append(key) or sess.run(*a))

    measurer._session = counted
    runs_before, reused = None, 0
    for parts in cases:
        before = len(runs)
        got = [measurer._outputs(parts, i) for i in range(len(samples))]
        fresh = [measurer.run(parts, s) for s in samples]
        ran = len(runs) - before - len(parts) * len(samples)  # less the fresh runs'
        for g, f in zip(got, fresh):
            assert g.keys() == f.keys() and all(np.array_equal(g[k], f[k]) for k in g)
        if runs_before:  # from the first part that differs from the one before's, on each sample
            same = [(p.inputs, p.outputs, p.precision) for p in parts]
            shared = next(j for j, (a, b) in enumerate(zip(same, runs_before)) if a != b)
            assert ran == (len(parts) - shared) * len(samples), (ran, shared)
            reused += shared
        runs_before = [(p.inputs, p.outputs, p.precision) for p in parts]
    assert reused > 0
    assert measurer(cases[1]) == compare(
        measurer.reference, [measurer.run(cases[1], s) for s in samples]
    )


def test_a_second_partition_of_the_same_model_converts_no_part_again(
    split_net, tmp_path, monkeypatch
):
    """Measurers share what they found by content: partitioning the same model again (a loaded
    copy, a fresh measurer, as a sweep over bandwidths does) converts and runs no part again, and
    gives the same figures; other calibration data is measured afresh."""
    graph, device = split_net
    made = []
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))  # no figures earlier tests kept
    monkeypatch.setattr(
        edgesplit.precision.measure, "_MEMOS", OrderedDict()
    )  # what earlier tests left
    real = edgesplit.precision.measure.part_model
    monkeypatch.setattr(
        edgesplit.precision.measure,
        "part_model",
        lambda *a, **k: made.append(a[3]) or real(*a, **k),
    )

    def plan(g, data=None):
        p = resolve(g, device, Choices(profile=made_up_profile(g, device), calibration_data=data))
        return _solve(p, AccuracyBudget(min_snr_db=30.0))

    first = plan(graph)
    assert "int8" in made and first.accuracy is not None
    n = len(made)
    again = plan(edgesplit.load_model(graph.path))
    assert len(made) == n and again.accuracy.measured == first.accuracy.measured
    xs = np.random.default_rng(1).standard_normal((6, 1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "cal.npz", x=xs)
    plan(graph, tmp_path / "cal.npz")
    assert len(made) > n  # new ranges: new int8 parts


def test_a_new_process_reads_the_figures_from_disk_and_measures_an_unreadable_file_again(
    split_net, tmp_path, monkeypatch
):
    """``partition`` then ``deploy`` are two processes: the second converts and runs no part, and
    makes the same plan from the same figures (in full, not rounded); a cache file that is not
    what the measurer wrote is measured again and replaced."""
    graph, device = split_net
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    made = []
    real = edgesplit.precision.measure.part_model
    monkeypatch.setattr(
        edgesplit.precision.measure,
        "part_model",
        lambda *a, **k: made.append(a[3]) or real(*a, **k),
    )

    def plan():
        monkeypatch.setattr(edgesplit.precision.measure, "_MEMOS", OrderedDict())  # a new process
        p = resolve(
            edgesplit.load_model(graph.path),
            device,
            Choices(profile=made_up_profile(graph, device)),
        )
        return _solve(p, AccuracyBudget(min_snr_db=30.0))

    first = plan()
    files = sorted((tmp_path / "cache" / "accuracy").glob("*.json"))
    assert "int8" in made and files
    kept = {f: json.loads(f.read_text()) for f in files}
    made.clear()
    again = plan()
    assert made == [] and again.accuracy == first.accuracy and again.assignment == first.assignment
    assert any(v["snr_db"] != round(v["snr_db"], 6) for v in kept.values())  # kept in full
    for f, garbage in zip(files, ["{", '{"snr_db": "high"}', "[1, 2]", ""], strict=False):
        f.write_text(garbage)
    third = plan()
    assert "int8" in made and third.accuracy == first.accuracy
    assert {f: json.loads(f.read_text()) for f in files} == kept  # measured again, the same
    shutil.rmtree(tmp_path / "cache" / "accuracy")
    (tmp_path / "cache" / "accuracy").write_text(
        "a file where the folder goes"
    )  # nothing can be kept
    assert plan().accuracy == first.accuracy


def test_a_bundle_with_int8_parts_runs_and_meets_its_budget(problem, tmp_path):
    budget = AccuracyBudget(min_snr_db=15.0)
    plan = _solve(problem, budget)
    assert _int8_nodes(plan) and plan.accuracy.meets
    manifest = edgesplit.compile_bundle(
        problem.graph, plan, tmp_path / "bundle", device=problem.device
    )
    int8 = [p for p in manifest.parts if p.precision == "int8"]
    assert int8 and all(p.backend == "ort-int8" and p.file.endswith(".int8.onnx") for p in int8)
    x = calibration_set(problem.graph).held_out[0]
    with edgesplit.load(tmp_path / "bundle") as session:
        got = session.run(dict(x))["y"]
    assert got.shape == (1, 10) and np.all(np.isfinite(got))
    measured = bundle_accuracy(tmp_path / "bundle")
    assert budget.meets(measured), measured.summary()
    assert measured.snr_db == pytest.approx(plan.accuracy.measured.snr_db, abs=0.5)


def _ranges(path) -> dict[str, tuple[float, float]]:
    from onnxruntime.quantization.calibrate import load_tensors_data

    return {
        k: tuple(float(np.min(x)) for x in v.range_value)
        for k, v in load_tensors_data(path).data.items()
    }


ENTROPY = pytest.param(
    "entropy", marks=pytest.mark.slow
)  # ORT's entropy calibrator takes 10 s here


@pytest.mark.parametrize("method", ["percentile", ENTROPY])
def test_a_calibration_method_is_cached_apart_recorded_and_compiled_with(problem, tmp_path, method):
    """``--calibration-method``: ORT's calibrator of that name. Its ranges are cached apart from
    MinMax's and differ from them (percentile's lie inside MinMax's extremes); the plan records the
    method, compile quantizes with it (its bundle measures as the plan did, not as the MinMax plan
    did; ORT refuses a cache of another method)."""
    from edgesplit.precision import recorded_calibration

    graph, device = problem.graph, problem.device
    data = calibration_set(graph)
    minmax, other = calibrate(graph, data, "minmax"), calibrate(graph, data, method)
    assert (
        other != minmax
        and other.stem.split("-")[2] == method
        and calibrate(graph, data, method) == other
    )
    wide, mine = _ranges(minmax), _ranges(other)
    assert wide.keys() == mine.keys() and wide != mine
    if method == "percentile":
        assert all(wide[k][0] <= lo and hi <= wide[k][1] + 1e-6 for k, (lo, hi) in mine.items())
    any_int8 = AccuracyBudget(min_snr_db=-SNR_CAP_DB)
    base = _solve(problem, any_int8)
    chosen = resolve(graph, device, Choices(profile=problem.profile, calibration_method=method))
    plan = _solve(chosen, any_int8)
    assert _int8_nodes(plan) == _int8_nodes(base)
    assert base.accuracy.calibration.method == "minmax"
    assert recorded_calibration(plan.accuracy)[1] == method
    manifest = edgesplit.compile_bundle(graph, plan, tmp_path / "b", device=device)
    int8 = [p for p in manifest.parts if p.precision == "int8"]
    assert int8 and all(p.note.endswith(f"with {method}") for p in int8)

    def scales(ranges) -> dict[str, np.ndarray]:  # every int8 part's quantization scales
        out = {}
        for p in int8:
            m = edgesplit.precision.measure.part_model(
                graph, [t.name for t in p.inputs], [t.name for t in p.outputs], "int8", ranges
            )
            out.update(_scales(m))
        return out

    shipped = {}
    for p in int8:
        shipped.update(_scales(onnx.load(tmp_path / "b" / p.file)))
    assert shipped.keys() == scales(other).keys()
    assert all(np.array_equal(shipped[k], v) for k, v in scales(other).items())
    assert any(not np.array_equal(shipped[k], v) for k, v in scales(minmax).items())


def _scales(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {
        i.name: onnx.numpy_helper.to_array(i)
        for i in model.graph.initializer
        if i.name.endswith("_scale")
    }


def test_a_plan_recorded_before_calibration_methods_is_minmax():
    from edgesplit.errors import PlanError
    from edgesplit.precision import DEFAULT_CALIBRATION_METHOD, recorded_calibration
    from edgesplit.precision.record import AccuracyRecord

    record = {"calibration": {"source": "photos", "path": "a.npz"}}
    old = AccuracyRecord.from_json(record, "plan", PlanError)
    assert recorded_calibration(old) == ("a.npz", "minmax")
    assert recorded_calibration(None) == (None, DEFAULT_CALIBRATION_METHOD)


def test_compile_checks_int8_parts_by_the_budget_and_refuses_a_wrong_scale(
    problem, tmp_path, monkeypatch
):
    """An int8 part is checked by the plan's accuracy measure, not the fp32 tolerance: compile runs
    the artifacts that ship on the held-out samples and reports the SNR against the budget. With
    the calibration's ranges shrunk 100-fold (int8 scales far too small: every activation clips),
    the same plan's bundle is refused, naming the part."""
    import json

    from edgesplit.compile.precision_check import plan_budget
    from edgesplit.errors import CompileError

    plan = _solve(problem, AccuracyBudget(min_snr_db=15.0))
    assert _int8_nodes(plan)
    manifest = edgesplit.compile_bundle(problem.graph, plan, tmp_path / "ok", device=problem.device)
    note = next(n for n in manifest.notes if n.startswith("precision check"))
    assert "budget (plan) SNR >= 15 dB: met" in note and "held-out photos samples" in note, note
    int8 = [p.name for p in plan.parts if p.precision == "int8"]
    assert all(f"{name} " in note.split("each part's outputs:")[1] for name in int8), note
    assert plan_budget(plan, None) == (AccuracyBudget(min_snr_db=15.0), "plan")
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))  # spoil a private copy only
    ranges = calibrate(problem.graph, calibration_set(problem.graph))
    assert tmp_path in ranges.parents
    table = json.loads(ranges.read_text())
    for t in table["data"].values():
        for end in ("lowest", "highest"):
            t[end]["data"] = [v / 100 for v in t[end]["data"]]
    ranges.write_text(json.dumps(table))
    with pytest.raises(
        CompileError, match=r"miss the accuracy budget .* SNR .* < 15 dB .* worst part is p\d"
    ):
        edgesplit.compile_bundle(problem.graph, plan, tmp_path / "broken", device=problem.device)
    assert not (tmp_path / "broken").exists()


@pytest.mark.slow
def test_verification_never_ships_a_plan_that_misses_the_accuracy_budget(problem, tmp_path, capsys):
    """deploy's verification measures each int8 candidate's accuracy through the runtime: held to a
    budget 5 dB over what the plan measures, the plan is not shipped, the all-fp32 baseline is, and
    the table says why. Under the budget it was made for, it meets it."""
    from edgesplit.cli.compile import print_verification
    from edgesplit.workflows.verify import VerifyOptions, verify_plan

    def held_to(budget):
        return dataclasses.replace(
            problem, accuracy=dataclasses.replace(problem.accuracy, budget=budget)
        )

    loose = AccuracyBudget(min_snr_db=15.0)
    plan = _solve(problem, loose)
    snr = plan.accuracy.measured.snr_db
    assert _int8_nodes(plan) and snr < SNR_CAP_DB
    tight = AccuracyBudget(min_snr_db=round(snr + 5.0, 1))
    options = VerifyOptions(budget_s=3.0)
    m = verify_plan(held_to(tight), plan, tmp_path / "tight", options=options)
    v = m.verification
    row = v.candidate("plan")
    assert row.meets_budget is False and row.snr_db == pytest.approx(snr, abs=0.5), row
    assert "SNR" in row.accuracy_misses and v.accuracy_budget == tight.summary()
    # plain ORT on host-npu is its one CPU core (the NPU's core is no CPU core): only:cpu's bundle
    assert v.candidate("only:cpu").same_as == "plain-ort"
    assert (
        v.shipped == "plain-ort" and not v.kept_plan and "misses the accuracy budget" in v.reason
    ), v.reason
    assert v.candidate("plain-ort").meets_budget is None  # all fp32: exact, not run
    assert (
        all(p.precision == "fp32" for p in m.parts) and m.plan.solver.name == "baseline:plain-ort"
    )
    print_verification(v)
    assert "shipped plain-ort: the plan misses the accuracy budget" in " ".join(
        capsys.readouterr().out.split()
    )
    v = verify_plan(held_to(loose), plan, tmp_path / "loose", options=options).verification
    assert v.candidate("plan").meets_budget is True and v.candidate("plan").accuracy_misses == ""


def test_verification_never_ships_an_int8_baseline_that_misses_the_budget(split_net, tmp_path):
    """On an NPU that runs every op, ``only:npu`` (the whole model in int8) is one of deploy's
    baselines, priced 4x faster than the CPU. Under a budget no int8 part meets, the plan is all
    fp32; the baseline's accuracy is measured like the plan's, and it is never shipped, however
    fast it measures. The rule alone says the same on given figures."""
    from edgesplit.bundle.verdict import MeasuredCandidate
    from edgesplit.workflows.verify import VerifyOptions, verify_plan
    from edgesplit.workflows.verify.decide import decide

    graph, _ = split_net
    (tmp_path / "all.yaml").write_text(
        NPU_SPEC.replace(
            "    ops: {only: [Conv, Relu, GlobalAveragePool, Flatten, Gemm, Add]}\n", ""
        )
    )
    device = edgesplit.load_device(tmp_path / "all.yaml")
    cpu = {n.name: NodeCost(1.0, 1.0, MEASURED, 3.0, 5) for n in graph.nodes}
    npu = {n.name: NodeCost(0.25, 0.25, MEASURED, 0.75, 5) for n in graph.nodes}
    entries = (
        ProcessorProfile("cpu", "ort", MEASURED, cpu, dispatch_ms=0.05),
        ProcessorProfile("npu", "ort-int8", MEASURED, npu, dispatch_ms=0.05),
    )
    prof = Profile(graph.sha256, graph.name, device.name, graph.input_shapes(), entries)
    budget = AccuracyBudget(min_snr_db=80.0)
    problem = resolve(graph, device, Choices(profile=prof, accuracy=budget))
    plan = solve_plan(problem)
    assert not _int8_nodes(plan)
    v = verify_plan(
        problem, plan, tmp_path / "out", options=VerifyOptions(budget_s=3.0)
    ).verification
    row = v.candidate("only:npu")
    assert row.error is None and row.meets_budget is False and row.snr_db < 80.0, row
    assert v.shipped != "only:npu" and v.accuracy_budget == budget.summary()

    def timed(name, ms, **kw):
        return MeasuredCandidate(name, "", 1, None, ms, rounds_ms=(ms, ms, ms), **kw)

    npu_row = timed("only:npu", 1.0, snr_db=20.0, meets_budget=False, accuracy_misses="SNR 20 < 80")
    assert (
        decide([timed("plan", 4.0), timed("only:cpu", 5.0), npu_row], "latency", None)[0] == "plan"
    )
    missing = timed("plan", 2.0, snr_db=20.0, meets_budget=False, accuracy_misses="SNR 20 < 80")
    assert decide([missing, timed("only:cpu", 5.0), npu_row], "latency", None)[0] == "only:cpu"


def test_an_int8_only_processor_never_gets_an_fp32_part(tmp_path, split_net):
    (tmp_path / "bad.yaml").write_text(NPU_SPEC.replace("runtime: ort-int8", "runtime: ort"))
    with pytest.raises(
        DeviceSpecError, match=r"processors.npu.backends.0.runtime: 'ort' runs fp32"
    ):
        edgesplit.load_device(tmp_path / "bad.yaml")
    graph, device = split_net
    plan = _solve(
        resolve(graph, device, Choices(profile=made_up_profile(graph, device))), AccuracyBudget()
    )
    forged = dataclasses.replace(
        plan, parts=tuple(dataclasses.replace(p, backend="ort") for p in plan.parts)
    )
    with pytest.raises(PlanError, match=r"npu runs \['int8'\], not fp32"):
        with_precisions(forged, device)


@pytest.mark.slow
def test_a_snapdragon_plan_has_int8_npu_parts_checked_here(tmp_path):
    """The Hexagon NPU is priced in int8 from AI Hub's figures; the plan's accuracy check runs here,
    on the same int8 QDQ parts, and compile makes them int8 artifacts for the QNN provider."""

    def conv(i: str, o: str, n: int):
        return helper.make_node(
            "Conv", [i, f"w{n}", f"b{n}"], [o], pads=[1, 1, 1, 1], name=f"conv{n}"
        )

    nodes = [
        conv("x", "c1", 1),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        conv("r1", "c2", 2),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", ["c2"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    weights = [("wf", rand(10, 32, seed=9) * 10), ("bf", rand(10, seed=8))]
    for n, ci in ((1, 3), (2, 32)):
        weights += [(f"w{n}", rand(32, ci, 3, 3, seed=n)), (f"b{n}", rand(32, seed=10 + n))]
    onnx.save(
        make_model(nodes, [("x", [1, 3, 224, 224])], [("y", [1, 10])], weights), tmp_path / "m.onnx"
    )
    graph = edgesplit.load_model(tmp_path / "m.onnx")
    plan = edgesplit.partition(graph, "snapdragon-8gen2", accuracy=AccuracyBudget(min_snr_db=15.0))
    npu = [p for p in plan.parts if p.processor == "npu"]
    assert npu and all(p.precision == "int8" and p.backend == "ort-int8" for p in npu), plan.parts
    assert plan.accuracy.meets and plan.accuracy.calibration.source == "photos"
    assert 15.0 <= plan.accuracy.measured.snr_db < SNR_CAP_DB  # measured, not exact
    manifest = edgesplit.compile_bundle(graph, plan, tmp_path / "b")
    art = [p for p in manifest.parts if p.processor == "npu"]
    assert all(p.precision == "int8" and p.provider == "QNNExecutionProvider" for p in art)
    assert all(p.file.endswith(".int8.onnx") for p in art)


def test_an_old_opset_model_quantizes_per_channel(tmp_path):
    """PP-OCRv4 det is opset 12: per-channel DequantizeLinear needs 13, so the part is converted.
    (32 x 32 as split_net: the calibration photographs of that size are made once per process.)"""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    weights = [("w", rand(8, 3, 3, 3, seed=1)), ("b", rand(8, seed=2))]
    onnx.save(
        make_model(nodes, [("x", [1, 3, 32, 32])], [("y", [1, 8, 32, 32])], weights, opset=12),
        tmp_path / "m.onnx",
    )
    graph = edgesplit.load_model(tmp_path / "m.onnx")
    data = calibration_set(graph)
    q = convert(graph.model, "int8", calibrate(graph, data))
    assert q.opset_import[0].version >= 13
    assert any(
        n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute)
        for n in q.graph.node
    )
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    x = data.held_out[0]
    assert compare([{"y": _tensor(graph, "y", x)}], [{"y": sess.run(None, dict(x))[0]}]).snr_db > 20


def test_calibration_data_from_files(split_net, tmp_path):
    graph, _ = split_net
    xs = np.random.default_rng(0).standard_normal((6, 1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "cal.npz", x=xs)
    (tmp_path / "npy").mkdir()
    for i in range(3):
        np.save(tmp_path / "npy" / f"s{i}.npy", xs[i])
    from_npz, from_dir = (
        calibration_set(graph, tmp_path / "cal.npz"),
        calibration_set(graph, tmp_path / "npy"),
    )
    assert (from_npz.source, len(from_npz.samples), len(from_dir.samples)) == ("file", 6, 3)
    assert np.array_equal(from_dir.samples[1]["x"], xs[1]) and from_npz.sha256 != from_dir.sha256
    np.savez(tmp_path / "bad.npz", x=xs[:, :, :2])
    with pytest.raises(InputError, match=r"bad.npz: 'x' has shape \[6, 1, 2, 32, 32\]"):
        calibration_set(graph, tmp_path / "bad.npz")
    np.savez(tmp_path / "other.npz", z=xs)
    with pytest.raises(InputError, match=r"unknown inputs \['z'\]; missing inputs \['x'\]"):
        calibration_set(graph, tmp_path / "other.npz")


def test_synthetic_calibration_warns(tmp_path):
    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [("x", [4, 8])],
        [("y", [4, 8])],
        [("w", rand(8, 8))],
    )
    onnx.save(m, tmp_path / "mm.onnx")
    data = calibration_set(edgesplit.load_model(tmp_path / "mm.onnx"))
    assert data.source == "synthetic" and "weak" in data.warning and "warning" in data.describe()


def test_fp16_conversion_and_its_accuracy_check_on_cpu(split_net):
    """float16 via onnxconverter-common: inputs and outputs stay float32, the weights are fp16,
    and the accuracy check measures it (ORT's CPU provider runs it through casts)."""
    graph, _ = split_net
    model = convert(graph.model, "fp16")
    io = [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)]
    assert io == [onnx.TensorProto.FLOAT] * 2
    assert any(w.data_type == onnx.TensorProto.FLOAT16 for w in model.graph.initializer)
    measurer = PlanMeasurer(graph)
    whole = edgesplit.optimize.plan.Part(
        name="p0", processor="gpu", backend="ort-fp16", nodes=tuple(n.name for n in graph.nodes),
        inputs=("x",), outputs=("y",), precision="fp16",
    )  # fmt: skip
    acc = measurer([whole])
    assert acc.snr_db > 40 and acc.top1_agreement == 1.0, acc.summary()


@pytest.mark.cuda
def test_fp16_part_on_cuda(split_net):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no CUDAExecutionProvider in this onnxruntime")
    graph, _ = split_net
    model = convert(graph.model, "fp16")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    x = calibration_set(graph).held_out[0]
    ref = _tensor(graph, "y", x)
    assert compare([{"y": ref}], [{"y": sess.run(None, dict(x))[0]}]).snr_db > 40


@pytest.mark.slow  # three int8 conversions and measurements of a 16-node part: about 5 s
def test_a_budget_drops_the_noisy_half_of_a_long_int8_part_not_all_of_it(tmp_path):
    """One int8 part of 16 nodes whose noise is all in its second half: a budget between the SNR of
    the whole part in int8 and that of its first half alone drops only the second half."""
    from edgesplit.optimize.accuracy import _alone, units

    (tmp_path / "npu.yaml").write_text(NPU_SPEC)
    graph = edgesplit.load_model(noisy_tail_chain(tmp_path / "chain.onnx"))
    device = edgesplit.load_device(tmp_path / "npu.yaml")
    problem = resolve(graph, device, Choices(profile=made_up_profile(graph, device)))
    first = _solve(problem, AccuracyBudget(min_snr_db=-SNR_CAP_DB))
    int8 = [p for p in first.parts if p.precision == "int8"]
    assert len(int8) == 1 and len(int8[0].nodes) == 16
    halves = units(graph, int8[0])
    assert [len(u.nodes) for u in halves] == [8, 8] and {"add_big", "add_back"} <= set(
        halves[1].nodes
    )
    measure = PlanMeasurer(graph)
    whole, clean = measure(first.parts), measure(_alone(first, halves[0], graph))
    assert clean.snr_db > whole.snr_db + 10, (clean.summary(), whole.summary())
    plan = _solve(problem, AccuracyBudget(min_snr_db=(clean.snr_db + whole.snr_db) / 2))
    kept = _int8_nodes(plan)
    assert set(halves[0].nodes) <= kept and not kept & set(halves[1].nodes), plan.accuracy.dropped
    assert plan.accuracy.meets and [d.part for d in plan.accuracy.dropped] == [halves[1].name]


@pytest.mark.slow
@pytest.mark.measures
def test_int8_part_edges_cost_what_the_profiler_measured(tmp_path):
    """An int8 part between fp32 parts pays, at its way in, a quantization and a layout transpose,
    and at its way out a transpose and a dequantization: ORT's integer convolution is channels-last.
    The profiler measures its per-MB edge costs on a micro-part with exactly those kernels (the
    transposes were missing: measured alone, QuantizeLinear and DequantizeLinear priced det's part
    edges at about half of what they cost); a real int8 part compiled from a conv chain has the same
    kernels at its edges, and the profile predicts their time there within a generous factor."""
    from edgesplit.device.cpu import ort_session_options
    from edgesplit.precision.measure import part_model

    nodes, weights, prev = [], [], "x"
    for i in range(3):
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        weights.append((f"w{i}", rand(48, 48 if i else 3, 1, 1, seed=i)))
        prev = f"r{i}"
    onnx.save(
        make_model(nodes, [("x", [1, 3, 160, 160])], [(prev, [1, 48, 160, 160])], weights),
        tmp_path / "c.onnx",
    )
    graph = edgesplit.load_model(tmp_path / "c.onnx")
    (tmp_path / "npu.yaml").write_text(NPU_SPEC)
    device = edgesplit.load_device(tmp_path / "npu.yaml")
    npu = edgesplit.profile_model(
        graph, device, edgesplit.ProfileOptions(["ort-int8"], runs=5, warmup=2)
    )
    entry = npu.entry("npu", "ort-int8")
    assert (
        "in (QuantizeLinear, Transpose)" in entry.note
        and "out (Transpose, DequantizeLinear)" in entry.note
    )
    part = part_model(graph, ["r0"], ["r1"], "int8", calibrate(graph, calibration_set(graph)))
    so = ort_session_options(
        1, None, enable_profiling=True, profile_file_prefix=str(tmp_path / "p")
    )
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = ort.InferenceSession(part.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = {"r0": np.abs(rand(1, 48, 160, 160, seed=5))}
    for _ in range(12):
        sess.run(None, x)
    opt = onnx.load(tmp_path / "opt.onnx").graph
    made = {t: n for n in opt.node for t in n.output}
    q_in = next(n for n in opt.node if "r0" in n.input)
    into = [q_in] + [n for n in opt.node if q_in.output[0] in n.input and n.op_type == "Transpose"]
    dq_out = made["r1"]
    out_of = (
        [made[dq_out.input[0]], dq_out]
        if made[dq_out.input[0]].op_type == "Transpose"
        else [dq_out]
    )
    assert [n.op_type for n in into] == ["QuantizeLinear", "Transpose"]
    assert [n.op_type for n in out_of] == ["Transpose", "DequantizeLinear"]
    from edgesplit.backends.ort.profile import _kernel_times

    kernels = _kernel_times(sess.end_profiling())
    measured = sum(float(np.median(kernels[n.name][4:])) for n in into + out_of)
    mb = 4 * 48 * 160 * 160 / 1e6
    predicted = (entry.edge_in_ms_per_mb + entry.edge_out_ms_per_mb) * mb
    assert 1 / 3 <= measured / predicted <= 3, (measured, predicted)
