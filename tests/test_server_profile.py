"""A profile measured on the server prices the server's processors (``--server-profile``), instead
of the server spec's roofline."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import run_cli

from edgesplit.device.spec import load_device, read_spec
from edgesplit.errors import PlanError
from edgesplit.model.load import load_model
from edgesplit.optimize.plan import load_plan
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import load_profile
from edgesplit.workflows.resolve import Choices, partition, problem_from_plan, resolve

# A server whose spec claims 10 MFLOP/s and 10 MB/s: its roofline prices a conv at milliseconds, a
# hundred times what the core measures.
SERVER = """\
name: lab-server
kind: server
description: this machine's second core, standing for a server measured where it runs
processors:
  cpu:
    kind: cpu
    cores: [1]
    threads: 1
    peak_gflops: 0.01
    mem_bandwidth_gbps: 0.01
    active_w: 50
    idle_w: 10
    backends: [{runtime: ort}]
"""
QUICK = ProfileOptions(runs=3, warmup=1)


@pytest.fixture(scope="module")
def _measured() -> dict:
    """The two profiles of the lab's model, measured by the first test that asks (the model is the
    same bytes in every test's folder, so its profiles are too)."""
    return {}


@pytest.fixture
def lab(tiny_conv, tmp_path, _measured):
    """The model, the server spec, a profile measured on the server, and one of the device."""
    (tmp_path / "srv.yaml").write_text(SERVER)
    graph = load_model(tiny_conv)
    if not _measured:
        spec = read_spec(tmp_path / "srv.yaml").load(local=True)
        _measured["srv"] = profile_model(graph, spec, QUICK)  # --here
        _measured["dev"] = profile_model(
            graph, load_device("host-2core"), replace(QUICK, processors=("core0",))
        )
    assert _measured["srv"].model_sha256 == graph.sha256
    _measured["srv"].save(tmp_path / "srv.json")
    _measured["dev"].save(tmp_path / "dev.json")
    return {"graph": graph, "model": tiny_conv, "spec": tmp_path / "srv.yaml", "dir": tmp_path}


def _resolve(lab, **kw):
    choices = Choices(profile=lab["dir"] / "dev.json", server=str(lab["spec"]), link="wifi", **kw)
    return resolve(lab["graph"], "host-2core", choices)


def test_the_server_is_priced_by_its_profile_not_its_roofline(lab):
    measured = load_profile(lab["dir"] / "srv.json").entry("cpu", "ort")
    assert measured is not None and measured.source == "measured"
    rooflined = _resolve(lab).profile.entry("lab-server.cpu", "ort")
    priced = _resolve(lab, server_profile=lab["dir"] / "srv.json").profile.entry(
        "lab-server.cpu", "ort"
    )
    assert rooflined.source == "predicted" and priced.source == "measured"
    plan = partition(
        lab["graph"], "host-2core", profile=lab["dir"] / "dev.json", server=str(lab["spec"])
    )
    assert plan.cost_sources["lab-server.cpu/ort"] == "predicted"  # what a plan shows it rests on
    assert priced.nodes == measured.nodes
    # the roofline's 10 MFLOP/s against what one core really takes
    assert priced.nodes["conv2"].latency_ms < rooflined.nodes["conv2"].latency_ms / 10


def test_a_server_profile_must_be_of_the_model_the_server_and_its_processors(lab, tmp_path):
    with pytest.raises(PlanError, match="--server-profile needs --server"):
        resolve(
            lab["graph"],
            "host-2core",
            Choices(profile=lab["dir"] / "dev.json", server_profile="x.json"),
        )
    with pytest.raises(
        PlanError, match=r"dev\.json: it is a profile of device 'host-2core', not of the server"
    ):
        _resolve(lab, server_profile=lab["dir"] / "dev.json")
    d = json.loads((lab["dir"] / "srv.json").read_text())
    d["entries"][0]["processor"] = "gpu"
    (tmp_path / "gpu.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match=r"gpu\.json: processors gpu are not the server's \(cpu\)"):
        _resolve(lab, server_profile=tmp_path / "gpu.json")
    d = json.loads((lab["dir"] / "srv.json").read_text())
    d["model_sha256"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match=r"other\.json: the profile is for model 000000000000"):
        _resolve(lab, server_profile=tmp_path / "other.json")


@pytest.mark.slow
def test_a_plan_records_the_server_profile_and_its_problem_merges_it_again(lab):
    """From the CLI and from code: the plan names both profiles, and the problem made again from
    it (compile's bands, explain, verify) prices the server as measured, not by the roofline."""
    d = lab["dir"]
    args = ["--device", "host-2core", "--profile", d / "dev.json", "--server", lab["spec"]]
    r = run_cli(
        "partition", lab["model"], *args, "--server-profile", d / "srv.json", "-o", d / "plan.json"
    )
    assert r.returncode == 0, r.stderr
    assert "measured on the server lab-server.cpu/ort" in " ".join(
        r.stdout.split()
    )  # the costs line
    measured = load_profile(d / "srv.json").entry("cpu", "ort").nodes
    in_code = partition(
        lab["graph"],
        "host-2core",
        profile=d / "dev.json",
        server=str(lab["spec"]),
        server_profile=d / "srv.json",
    )
    for plan in (load_plan(d / "plan.json"), in_code):
        assert (plan.profile_path, plan.server_profile_path) == (
            str(d / "dev.json"),
            str(d / "srv.json"),
        )
        assert plan.cost_sources["lab-server.cpu/ort"] == "measured"
        again = problem_from_plan(plan, lab["graph"]).profile.entry("lab-server.cpu", "ort")
        assert again.source == "measured" and again.nodes == measured


@pytest.mark.slow
def test_profile_here_measures_a_spec_not_marked_local_and_says_when_nothing_was(lab):
    """On the server itself, ``profile --device SERVER --here`` measures it; without --here a spec
    not marked local is all roofline, and the command says so."""
    d, args = lab["dir"], ["--runs", "3", "--warmup", "1", "-q"]
    r = run_cli(
        "profile", lab["model"], "--device", lab["spec"], "--here", "-o", d / "here.json", *args
    )
    assert r.returncode == 0, r.stderr
    assert load_profile(d / "here.json").entry("cpu", "ort").source == "measured"
    assert "nothing was measured" not in r.stdout
    r = run_cli("profile", lab["model"], "--device", lab["spec"], "-o", d / "there.json", *args)
    assert r.returncode == 0, r.stderr
    assert load_profile(d / "there.json").entry("cpu", "ort").source == "predicted"
    assert "nothing was measured" in r.stdout and "pass --here" in r.stdout


def test_the_h200_as_measured_moves_mobilenetv2_from_the_server_gpu_to_its_cpu(tmp_path):
    """profiles/mobilenetv2.server-h200.profile.json was measured on a lent H200 (`profile --device
    server-h200 --here`): untuned TVM ran the model in 3.1 ms on the GPU and ORT in 1.9 ms on the 16
    host cores. The spec's roofline puts the whole model on the GPU at about 0.5 ms; priced as
    measured, the server's part runs on its CPU instead, at the measured time."""
    from edgesplit.model import zoo
    from edgesplit.util import shipped_dir

    shipped = shipped_dir("profiles") / "mobilenetv2.server-h200.profile.json"
    graph = load_model(zoo.save("mobilenetv2", tmp_path / "mobilenetv2.onnx"))
    server = {}
    for key, server_profile in (("roofline", None), ("measured", shipped)):
        plan = partition(
            graph,
            "raspberry-pi5",
            server="server-h200",
            link="wifi",
            bandwidth_mbps=1000,
            rtt_ms=1,
            server_profile=server_profile,
        )
        server[key] = [p for p in plan.parts if p.processor.startswith("server-h200.")]
    assert [p.processor for p in server["roofline"]] == ["server-h200.gpu"]
    assert [p.processor for p in server["measured"]] == ["server-h200.cpu"]
    whole_cpu_ms = load_profile(shipped).entry("cpu", "ort").whole_model_ms
    part = server["measured"][0]
    assert len(part.nodes) == len(graph.nodes)
    assert part.end_ms - part.start_ms == pytest.approx(whole_cpu_ms, rel=0.1)
    assert server["roofline"][0].end_ms - server["roofline"][0].start_ms < 0.5 * whole_cpu_ms
