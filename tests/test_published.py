"""Published latencies of hardware we do not have, the fit of efficiencies to them, and its use."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgesplit.device.spec import load_device
from edgesplit.errors import ProfileError
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile import fit
from edgesplit.profile.predict import predict, roofline_ms, run_precision
from edgesplit.profile.published import (
    ProcessorFit,
    fit_path,
    load_fits,
    load_published,
    published_devices,
)

DEVICES = ("jetson-orin-nano", "raspberry-pi5", "server-a100", "snapdragon-8gen2")


def test_every_spec_we_cannot_measure_has_published_figures_and_a_calibration():
    assert set(DEVICES) <= set(published_devices())
    for device in DEVICES:
        assert fit_path(device).is_file()


@pytest.mark.parametrize("device", DEVICES)
def test_every_figure_is_complete_and_cited(device: str):
    published = load_published(device)  # validates the schema: every required field, batch 1
    spec = load_device(device)
    assert published.device == device
    for f in published.figures:
        source = published.sources[f.source]
        assert source["url"].startswith("https://") and source["date"] and source["where"]
        assert f.processor in spec.processor_names, f.id
        assert f.zoo_model is None or f.zoo_model in zoo.names(), f.id
        assert f.precision in ("fp32", "fp16", "int8") and f.latency_ms > 0 and f.runtime


@pytest.mark.parametrize("device", DEVICES)
def test_shipped_calibration_names_only_published_figures(device: str):
    cal = load_fits(device)
    ids = {f.id: f for f in load_published(device).figures}
    assert cal is not None and cal.device == device and cal.entries
    for e in cal.entries:
        assert e.figures and all(ids[i].processor == e.processor for i in e.figures)
        assert all(ids[i].precision == e.precision for i in e.figures)
        assert e.compute_efficiency > 0 and e.memory_efficiency > 0 and e.overhead_ms > 0


def _write_published(tmp_path: Path, mutate) -> Path:
    import yaml

    data = yaml.safe_load((Path(load_published("raspberry-pi5").path)).read_text())
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["figures"][0].pop("runtime"), "'runtime' is a required property"),
        (lambda d: d["figures"][0].update(source="nowhere"), "'nowhere' is not in sources"),
        (lambda d: d["figures"][0].update(precision="fp8"), "precision"),
        (lambda d: d["figures"][0].update(batch=8), "batch"),
        (lambda d: next(iter(d["sources"].values())).pop("url"), "'url' is a required property"),
        (lambda d: d["figures"].append(dict(d["figures"][0])), "is used twice"),
    ],
)
def test_a_bad_published_file_is_refused_naming_the_file(tmp_path: Path, mutate, message: str):
    path = _write_published(tmp_path, mutate)
    with pytest.raises(ProfileError, match=message) as e:
        load_published(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def _synthetic_models(rng: np.random.Generator, n: int) -> list[fit.NodeArrays]:
    """Models from call-bound (a few tiny nodes) and node-overhead-bound to compute- and
    memory-bound."""
    out = []
    for i in range(n):
        nodes = int(rng.integers(2, 5)) if i < 3 else int(rng.integers(10, 300))
        flops = rng.lognormal(np.log(10 ** (5 + i % 4)), 1.0, nodes)
        nbytes = rng.lognormal(np.log(10 ** (4 + (i * 3) % 4)), 1.0, nodes)
        rel = rng.choice([1.0, 0.18, 0.45], nodes)
        out.append(fit.NodeArrays(flops, nbytes, rel))
    return out


def test_fit_recovers_known_efficiencies_from_synthetic_latencies():
    proc = load_device("raspberry-pi5").processor("cpu")
    truth = (1.3, 0.8, 0.02, 0.3)  # compute_eff, memory_eff, overhead_ms, call_ms
    models = _synthetic_models(np.random.default_rng(3), 16)
    cases = [(a, fit.model_ms(a, proc, "fp16", *truth)) for a in models]
    recovered = fit.fit_efficiencies(cases, proc, "fp16")
    np.testing.assert_allclose(recovered, truth, rtol=0.05)
    # and a different truth gives a different answer (the fit follows the data, not the prior)
    truth2 = (0.4, 2.0, 0.005, 1.0)
    cases2 = [(a, fit.model_ms(a, proc, "fp16", *truth2)) for a in models]
    np.testing.assert_allclose(fit.fit_efficiencies(cases2, proc, "fp16"), truth2, rtol=0.05)


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory: pytest.TempPathFactory):
    return load_model(zoo.save("squeezenet", tmp_path_factory.mktemp("m") / "squeezenet.onnx"))


def _calibration_dir(tmp_path: Path, device: str, entry: dict) -> Path:
    folder = tmp_path / "profiles"
    (folder / "fitted").mkdir(parents=True)
    doc = {"device": device, "fitted": "2026-01-01", "published_file": "x", "entries": [entry]}
    (folder / "fitted" / f"{device}.json").write_text(json.dumps(doc))
    return folder


def test_predictor_uses_the_calibration_when_present_and_the_plain_roofline_when_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squeezenet
):
    spec = load_device("raspberry-pi5")
    proc = spec.processor("cpu")
    backend = proc.backend("ort")
    assert run_precision(proc, backend) == "fp32"
    entry = {
        "processor": "cpu",
        "precision": "fp32",
        "compute_efficiency": 0.2,
        "memory_efficiency": 0.3,
    }
    entry |= {"overhead_ms": 0.05, "call_ms": 0.7, "figures": ["x"]}
    monkeypatch.setenv("EDGESPLIT_PROFILES_DIR", str(_calibration_dir(tmp_path, spec.name, entry)))
    calibrated = predict(squeezenet, proc, backend, device=spec.name)
    cal = ProcessorFit("cpu", "fp32", 0.2, 0.3, 0.05, 0.7)
    for node in squeezenet.nodes:
        assert calibrated.nodes[node.name].latency_ms == pytest.approx(
            roofline_ms(node, proc, squeezenet, cal), abs=1e-6
        )
    assert calibrated.dispatch_ms == 0.7

    monkeypatch.setenv("EDGESPLIT_PROFILES_DIR", str(tmp_path / "empty"))
    plain = predict(squeezenet, proc, backend, device=spec.name)
    for node in squeezenet.nodes:
        assert plain.nodes[node.name].latency_ms == pytest.approx(
            roofline_ms(node, proc, squeezenet), abs=1e-6
        )
    assert plain.dispatch_ms is None
    assert calibrated.whole_model_ms > 1.5 * plain.whole_model_ms  # 0.2 of peak against 0.55


def test_calibration_applies_only_at_the_precision_the_processor_runs(squeezenet):
    spec = load_device("snapdragon-8gen2")
    npu, cpu = spec.processor("npu"), spec.processor("cpu_big")
    assert run_precision(npu, npu.backend("ort-fp16")) == "fp16"
    assert run_precision(npu, npu.backend("ort-int8")) == "int8"
    assert npu.precisions == ("int8", "fp16")  # never an fp32 part on the HTP
    assert run_precision(cpu, cpu.backend("ort")) == "fp32"
    shipped = load_fits(spec.name)
    assert shipped.lookup("npu", "fp16") is not None and shipped.lookup("cpu_big", "fp32") is None
    npu_profile = predict(squeezenet, npu, npu.backend("ort-fp16"), device=spec.name)
    assert npu_profile.dispatch_ms == shipped.lookup("npu", "fp16").call_ms
    int8 = predict(squeezenet, npu, npu.backend("ort-int8"), device=spec.name)
    assert int8.dispatch_ms == shipped.lookup("npu", "int8").call_ms  # priced from the int8 figures
    cpu_profile = predict(squeezenet, cpu, cpu.backend("ort"), device=spec.name)
    assert cpu_profile.dispatch_ms is None  # only fp16/int8 figures exist for it: plain roofline
    fp16 = replace(
        cpu.backend("ort"), runtime="ort-fp16", precision="fp16"
    )  # an fp16 backend there
    assert run_precision(cpu, fp16) == "fp16"
    assert (
        predict(squeezenet, cpu, fp16, device=spec.name).dispatch_ms
        == shipped.lookup("cpu_big", "fp16").call_ms
    )


@pytest.mark.slow
def test_leave_one_out_runs_on_shipped_data_and_beats_the_plain_roofline():
    spec, published = load_device("raspberry-pi5"), load_published("raspberry-pi5")
    groups = fit.groups(spec, published)
    assert {(g.processor.name, g.precision) for g in groups} == {("cpu", "fp16"), ("cpu", "int8")}
    shipped = load_fits("raspberry-pi5")
    for group in groups:
        preds = fit.leave_one_out(group)
        assert [p.figure.id for p in preds] == [f.id for f in group.figures]
        assert all(p.loo_ms is not None and p.loo_ms > 0 for p in preds)
        before = np.median([abs(p.plain_ms / p.figure.latency_ms - 1) for p in preds])
        after = np.median([abs(p.loo_ms / p.figure.latency_ms - 1) for p in preds])
        assert after < before
        # the shipped file is what a fit on all its figures gives today
        fitted, entry = fit.fit_group(group), shipped.lookup(group.processor.name, group.precision)
        assert entry.figures == fitted.figures
        for name in ("compute_efficiency", "memory_efficiency", "overhead_ms", "call_ms"):
            assert getattr(entry, name) == pytest.approx(getattr(fitted, name), rel=1e-3), name
