"""One serialiser per type, and each round-trips: profiles (and their entries), device specs, plans,
manifests, profile options. Older files (without fields added since) still read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from conftest import max_examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesplit.bundle.format import Manifest, PartArtifact, TensorSpec
from edgesplit.device.spec import (
    BACKENDS,
    NetworkLink,
    device_from_mapping,
    device_to_mapping,
    list_specs,
    load_device,
    read_spec,
)
from edgesplit.errors import DeviceSpecError
from edgesplit.optimize.plan import Baseline, Part, Plan, Predicted, SolverInfo, Transfer
from edgesplit.precision import CALIBRATION_METHODS
from edgesplit.precision.metrics import Accuracy, AccuracyBudget
from edgesplit.precision.record import AccuracyRecord, CalibrationRecord, DroppedPart
from edgesplit.profile.run import ProfileOptions
from edgesplit.profile.steps import load_partial, save_partial
from edgesplit.profile.store import NodeCost, ProcessorProfile, Profile, RunTerms

SETTINGS = settings(
    max_examples=max_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

names = st.text("abcdefgh_0123456789", min_size=1, max_size=8)
floats = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)
pos = st.floats(0.001, 1e6, allow_nan=False, allow_infinity=False)
maybe = st.one_of(st.none(), floats)


def via_json(d):
    return json.loads(json.dumps(d))


# ---- profiles


node_costs = st.builds(
    NodeCost,
    floats,
    floats,
    st.sampled_from(["measured", "predicted"]),
    maybe,
    st.integers(0, 1000),
)
run_terms = st.builds(
    RunTerms,
    part_fixed_ms=floats,
    reorder_ms_per_mb=maybe,
    reorder_in_ms=st.dictionaries(names, floats, max_size=3),
    reorder_out_ms=st.dictionaries(names, floats, max_size=3),
    blocked_tensors=st.lists(names, max_size=3).map(tuple),
    handoff_idle_ms=st.lists(floats, max_size=3).map(tuple),
    contention=st.dictionaries(names, pos, max_size=2),
)
entries = st.builds(
    ProcessorProfile,
    processor=names,
    backend=st.sampled_from(["ort", "tvm"]),
    source=st.sampled_from(["measured", "predicted"]),
    nodes=st.dictionaries(names, node_costs, max_size=5),
    unsupported=st.dictionaries(names, st.text(max_size=20), max_size=3),
    whole_model_ms=maybe,
    whole_model_p90_ms=maybe,
    note=st.text(max_size=30),
    elapsed_s=floats,
    dispatch_ms=maybe,
    energy=st.sampled_from(["measured", "modelled"]),
    terms=st.one_of(st.none(), run_terms),
)
shapes = st.dictionaries(names, st.tuples(*[st.integers(1, 64)] * 3).map(tuple), max_size=2)
profiles = st.builds(
    Profile,
    model_sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
    model_name=names,
    device=names,
    input_shapes=shapes,
    entries=st.lists(entries, max_size=3).map(tuple),
    energy=st.sampled_from(["measured", "modelled"]),
    versions=st.dictionaries(names, names, max_size=2),
    host=names,
    created=st.text(max_size=10),
)


@SETTINGS
@given(e=entries)
def test_processor_profile_round_trips_with_dispatch_and_energy(e):
    back = ProcessorProfile.from_json(via_json(e.to_json()))
    assert back == e
    assert back.dispatch_ms == e.dispatch_ms and back.energy == e.energy


@SETTINGS
@given(p=profiles)
def test_profile_round_trips(p):
    assert Profile.from_json(via_json(p.to_json())) == p


@SETTINGS
@given(e=st.lists(entries, min_size=1, max_size=3))
def test_checkpoints_keep_every_field(tmp_path_factory, e):
    """The partial profile ``--resume`` reads (the agent's checkpoints) keeps ``dispatch_ms``, which
    the old ``entry_from_json`` dropped."""
    part = tmp_path_factory.mktemp("partial") / "p.json.partial"
    save_partial(part, "a" * 64, "m", "dev", {"x": (1, 3)}, e)
    assert load_partial(part, "a" * 64, "dev") == e


def test_an_older_entry_reads_with_defaults():
    old = {
        "processor": "cpu",
        "backend": "ort",
        "source": "measured",
        "nodes": {"n": {"latency_ms": 1, "p90_ms": 2}},
    }
    e = ProcessorProfile.from_json(old)
    assert e.dispatch_ms is None and e.energy == "modelled" and e.nodes["n"].source == "measured"


@SETTINGS
@given(
    backends=st.one_of(
        st.none(), st.lists(st.sampled_from(sorted(BACKENDS)), min_size=1, max_size=2)
    ),
    processors=st.one_of(st.none(), st.lists(names, min_size=1, max_size=2)),
    runs=st.integers(1, 50),
    warmup=st.integers(0, 10),
)
def test_profile_options_round_trip(backends, processors, runs, warmup):
    o = ProfileOptions(backends, processors, runs, warmup)
    assert ProfileOptions.from_json(via_json(o.to_json())) == o


def test_profile_options_refuse_unknown_backends_and_bad_counts():
    from edgesplit.errors import InputError

    with pytest.raises(InputError, match="unknown backend 'cuda'"):
        ProfileOptions(["cuda"])
    with pytest.raises(InputError, match="runs must be at least 1"):
        ProfileOptions(runs=0)


# ---- device specs


def _backend(draw_runtime: str) -> dict:
    return (
        {"runtime": draw_runtime, "target": {"kind": "llvm"}}
        if draw_runtime == "tvm"
        else {"runtime": "ort"}
    )


@st.composite
def spec_mappings(draw) -> dict:
    procs = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    data: dict = {"name": draw(names), "kind": draw(st.sampled_from(["device", "server"]))}
    data["processors"] = {}
    for p in procs:
        d = {
            "kind": draw(st.sampled_from(["cpu", "gpu", "npu", "dsp"])),
            "backends": [
                _backend(r)
                for r in draw(st.lists(st.sampled_from(["ort", "tvm"]), min_size=1, max_size=2))
            ],
            "peak_gflops": draw(pos),
            "mem_bandwidth_gbps": draw(pos),
            "active_w": draw(floats),
            "idle_w": draw(floats),
        }
        if draw(st.booleans()):
            d["cores"] = draw(st.lists(st.integers(0, 7), min_size=1, max_size=3))
            d["threads"] = draw(st.integers(1, 4))
        if draw(st.booleans()):
            d["ops"] = {
                "exclude": draw(st.lists(st.sampled_from(["LSTM", "GRU", "Loop"]), unique=True))
            }
        if draw(st.booleans()):
            d["memory_mb"] = draw(pos)
        data["processors"][p] = d
    if len(procs) > 1 and draw(st.booleans()):
        data["links"] = [
            {"between": procs[:2], "bandwidth_gbps": draw(pos), "latency_ms": draw(floats)}
        ]
    if draw(st.booleans()):
        data["memory_mb"] = draw(pos)
    data["local"] = draw(st.booleans())
    return data


@SETTINGS
@given(data=spec_mappings())
def test_device_spec_round_trips(data):
    spec = device_from_mapping(data, "spec.yaml")
    written = via_json(device_to_mapping(spec))
    assert device_from_mapping(written, "spec.yaml") == spec


@pytest.mark.parametrize(
    "path", [p for p in list_specs() if p.stem != "links"], ids=lambda p: p.stem
)
def test_load_device_is_the_mapping_reader(path):
    """``load_device`` is read_spec + device_from_mapping: the same DeviceSpec, and it
    round-trips."""
    spec = load_device(path)
    assert read_spec(path).load() == spec
    assert device_from_mapping(via_json(device_to_mapping(spec)), spec.path) == spec


def test_link_ends_are_checked_on_every_path(tmp_path):
    """The agent's spec reader used to skip this check (``device_from_dict``)."""
    data = yaml.safe_load(Path(read_spec("host-biglittle").path).read_text())
    data["links"] = [{"between": ["big", "nope"], "bandwidth_gbps": 1, "latency_ms": 0}]
    with pytest.raises(DeviceSpecError, match="links.0.between: unknown processor 'nope'"):
        device_from_mapping(data, "agent-spec")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(DeviceSpecError, match="links.0.between: unknown processor 'nope'"):
        load_device(tmp_path / "bad.yaml")


def test_a_server_combined_spec_is_not_written_as_one():
    dev = load_device("host-biglittle").with_server(load_device("server-a100"))
    with pytest.raises(DeviceSpecError, match="server's processors"):
        device_to_mapping(dev)


# ---- plans and manifests

texts = st.text("abcdefgh_.", min_size=1, max_size=6)
parts = st.builds(
    Part,
    name=names,
    processor=names,
    backend=st.sampled_from(["ort", "tvm"]),
    remote=st.booleans(),
    nodes=st.lists(texts, max_size=3).map(tuple),
    inputs=st.lists(texts, max_size=2).map(tuple),
    outputs=st.lists(texts, max_size=2).map(tuple),
    latency_ms=maybe,
    energy_mj=maybe,
    start_ms=maybe,
    end_ms=maybe,
    stage=st.integers(0, 5),
)
transfers = st.builds(
    Transfer, texts, st.integers(0, 10**9), names, names, names, names, floats, floats
)
baselines = st.builds(Baseline, names, maybe, maybe, st.booleans(), st.text(max_size=10), maybe)
solvers = st.builds(SolverInfo, names, floats, st.booleans(), maybe, names, st.text(max_size=10))
links = st.one_of(
    st.none(),
    names,  # an older plan's preset name
    st.builds(NetworkLink, names, pos, pos, floats, floats, floats, st.text(max_size=10)),
)
counts = st.one_of(st.none(), st.integers(1, 64))
predicted = st.builds(
    Predicted, latency_ms=maybe, period_ms=maybe, server_devices=counts, server_slots=counts
)
six = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 6))
figures = st.builds(
    Accuracy,
    st.floats(-200, 200).map(lambda x: round(x, 6)),
    six,
    six,
    st.one_of(st.none(), six),
    st.integers(0, 9),
)
calibrations = st.builds(
    CalibrationRecord,
    source=st.one_of(st.none(), names),
    held_out_samples=counts,
    path=st.one_of(st.none(), st.text(max_size=10)),
    method=st.one_of(st.none(), st.sampled_from(CALIBRATION_METHODS)),
)
drops = st.builds(
    DroppedPart,
    part=names,
    processor=names,
    precision=st.just("int8"),
    nodes=st.integers(1, 9),
    plan=figures,
    alone=figures,
    why=st.text(max_size=10),
)
records = st.builds(
    AccuracyRecord,
    budget=st.one_of(st.none(), st.builds(AccuracyBudget, maybe, maybe)),
    meets=st.one_of(st.none(), st.booleans()),
    measured=st.one_of(st.none(), figures),
    parts=st.one_of(st.none(), st.dictionaries(names, figures, max_size=2)),
    dropped=st.one_of(st.none(), st.lists(drops, max_size=2).map(tuple)),
    calibration=st.one_of(st.none(), calibrations),
)
plans = st.builds(
    Plan,
    model_sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
    model_name=names,
    model_path=st.text(max_size=20),
    device=names,
    server=st.one_of(st.none(), names),
    link=links,
    objective=st.sampled_from(["latency", "energy", "pareto", "manual"]),
    slo_ms=maybe,
    assignment=st.dictionaries(
        texts, st.fixed_dictionaries({"processor": names, "backend": names}), max_size=3
    ),
    parts=st.lists(parts, max_size=3).map(tuple),
    transfers=st.lists(transfers, max_size=2).map(tuple),
    predicted=predicted,
    baselines=st.lists(baselines, max_size=2).map(tuple),
    solver=solvers,
    pins=st.dictionaries(texts, names, max_size=2),
    input_shapes=shapes,
    device_path=st.text(max_size=10),
    profile_path=st.one_of(st.none(), st.text(max_size=10)),
    accuracy=st.one_of(st.none(), records),
)


@SETTINGS
@given(plan=plans)
def test_plan_round_trips(plan):
    assert Plan.from_json(via_json(plan.to_json())) == plan


@SETTINGS
@given(plan=plans)
def test_an_older_plan_reads_and_unknown_keys_are_left(plan):
    """A plan written before the optional fields existed reads with their defaults; a key from a
    newer writer is left alone (adding a field is one line in the dataclass)."""
    d = via_json(plan.to_json())
    for key in (
        "server",
        "link",
        "slo_ms",
        "transfers",
        "baselines",
        "solver",
        "pins",
        "device_path",
    ):
        d.pop(key)
    for p in d["parts"]:
        for key in ("latency_ms", "energy_mj", "start_ms", "end_ms", "stage", "remote"):
            p.pop(key)
        p["sparsity"] = 0.5  # what a later version may add
    d["calibration"] = {"x": 1}
    old = Plan.from_json(d)
    assert old.parts == tuple(
        dataclasses.replace(
            p, latency_ms=None, energy_mj=None, start_ms=None, end_ms=None, stage=0, remote=False
        )
        for p in plan.parts
    )
    assert old.server is None and old.transfers == () and old.solver.name == "manual"


tensor_specs = (
    st.lists(st.integers(1, 9), max_size=3)
    .map(tuple)
    .flatmap(
        lambda shape: st.builds(
            TensorSpec,
            texts,
            st.just(shape),
            st.sampled_from(["float32", "int64"]),
            st.just("tensor"),
            st.lists(st.integers(0, max(len(shape) - 1, 0)), unique=True, max_size=len(shape))
            .map(sorted)
            .map(tuple),
        )
    )
)
artifacts = st.builds(
    PartArtifact,
    name=names,
    processor=names,
    backend=st.sampled_from(["ort", "tvm"]),
    file=texts,
    onnx_file=texts,
    inputs=st.lists(tensor_specs, max_size=2).map(tuple),
    outputs=st.lists(tensor_specs, max_size=2).map(tuple),
    depends_on=st.lists(names, max_size=2).map(tuple),
    remote=st.booleans(),
    provider_options=st.dictionaries(names, names, max_size=1),
    target=st.one_of(st.none(), st.just({"kind": "llvm"})),
    threads=st.one_of(st.none(), st.integers(1, 8)),
    cores=st.one_of(st.none(), st.lists(st.integers(0, 7), min_size=1, max_size=2).map(tuple)),
    fallback=st.one_of(st.none(), st.just({"backend": "ort", "file": "parts/p0.onnx"})),
    predicted_ms=maybe,
    note=st.text(max_size=10),
)
manifests = st.builds(
    Manifest,
    model_sha256=names,
    model_name=names,
    device=names,
    inputs=st.lists(tensor_specs, max_size=2).map(tuple),
    outputs=st.lists(tensor_specs, max_size=2).map(tuple),
    parts=st.lists(artifacts, max_size=3).map(tuple),
    files=st.dictionaries(texts, names, max_size=3),
    plan=plans,
    server=st.one_of(st.none(), names),
    notes=st.lists(st.text(max_size=10), max_size=2).map(tuple),
)


@SETTINGS
@given(m=manifests)
def test_manifest_round_trips_and_keeps_the_plan_json(m):
    d = via_json(m.to_json())
    assert Manifest.from_json(d, "manifest.json") == m
    assert d["plan"] == via_json(m.plan.to_json())  # the plan's own JSON, as bundles always had
    assert isinstance(Manifest.from_json(d, "manifest.json").plan, Plan)


def test_a_malformed_plan_in_a_manifest_names_the_file():
    from edgesplit.errors import BundleError

    d = {
        "format_version": 1,
        "model_sha256": "x",
        "model_name": "m",
        "device": "d",
        "inputs": [],
        "outputs": [],
        "parts": [],
        "files": {},
        "plan": {"format_version": 1, "parts": []},
    }
    with pytest.raises(BundleError, match="bundle/manifest.json: plan: not a valid plan"):
        Manifest.from_json(d, "bundle/manifest.json")


def test_a_static_tensor_spec_writes_no_dynamic_axes():
    static = TensorSpec("x", (1, 3), "float32")
    assert "dynamic_axes" not in static.to_json()
    part = PartArtifact("p0", "cpu", "ort", "f", "f", (static,), ())
    assert "dynamic_axes" not in part.to_json()["inputs"][0]
    seq = TensorSpec("ids", (1, 4), "int64", dynamic_axes=(1,))
    assert seq.to_json()["dynamic_axes"] == [1] and TensorSpec.from_json(seq.to_json()) == seq
    assert seq.fits((1, 9)) and not seq.fits((2, 4)) and not seq.fits((1, 4, 1))
    assert seq.shown() == [1, "?"]
