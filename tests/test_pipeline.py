"""The pipeline context: one resolver for model, device, server, link, profile, pins, objective and
SLO, so that the API and every command agree. Each test here failed on the main branch before the
context existed (the drift bugs of issue 13)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import yaml

import edgesplit
from edgesplit.cli.main import main
from edgesplit.errors import DeviceSpecError, PlanError
from edgesplit.model import zoo

# The drift tests below use only what main had (the public API and the CLI), so that on main they
# fail for the bug they are about; helpers of the new context are imported where they are tested.
OBJECTIVES = ("latency", "latency_sequential", "energy", "throughput", "pareto")

BOARD = """\
name: pathboard
kind: device
description: a board known only by its file (not in devices/)
processors:
  cpu:
    kind: cpu
    peak_gflops: 20
    mem_bandwidth_gbps: 8
    active_w: 3.0
    idle_w: 0.3
    backends:
      - runtime: ort
  gpu:
    kind: gpu
    peak_gflops: 200
    mem_bandwidth_gbps: 20
    active_w: 4.0
    idle_w: 0.2
    backends:
      - runtime: ort
        provider: CUDAExecutionProvider
"""


LOCAL = """\
name: localboard
kind: device
description: this machine's first core, ORT only (measured quickly)
local: true
processors:
  cpu:
    kind: cpu
    cores: [0]
    threads: 1
    peak_gflops: 50
    mem_bandwidth_gbps: 10
    active_w: 3.0
    idle_w: 1.0
    backends:
      - runtime: ort
"""


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def tiny(tmp_path) -> Path:
    return zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")


@pytest.fixture
def local(tmp_path) -> Path:
    p = tmp_path / "localboard.yaml"
    p.write_text(LOCAL)
    return p


@pytest.fixture
def board(tmp_path) -> Path:
    p = tmp_path / "specs" / "pathboard.yaml"
    p.parent.mkdir()
    p.write_text(BOARD)
    return p


def test_partition_takes_paths_as_os_pathlike(tiny, board):
    """``edgesplit.partition(model, Path(...))`` raised AttributeError (only str was checked)."""
    plan = edgesplit.partition(
        Path(tiny), Path(board), server=Path(edgesplit.load_device("server-a100").path)
    )
    assert plan.device == "pathboard" and plan.server == "server-a100"
    assert plan.device_path == os.path.abspath(board)


def test_link_flags_without_a_server_are_refused_everywhere(capsys, tiny, board, tmp_path):
    """``deploy --link`` without ``--server`` was silently ignored, while ``partition`` refused
    it."""
    msg = "--link, --bandwidth-mbps and --rtt-ms need --server"
    for cmd in ("partition", "deploy"):
        for flag in (["--link", "lte"], ["--bandwidth-mbps", "5"], ["--rtt-ms", "30"]):
            code, _, err = run(
                capsys, cmd, str(tiny), "-d", str(board), *flag, "-o", str(tmp_path / cmd)
            )
            assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, (cmd, flag, err)
    with pytest.raises(PlanError, match=msg):
        edgesplit.partition(tiny, board, link="wifi")
    with pytest.raises(PlanError, match=msg):
        edgesplit.deploy(tiny, board, tmp_path / "b", bandwidth_mbps=5)
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_api_and_cli_measure_the_same_way_without_a_profile(capsys, tiny, local, tmp_path):
    """The API predicted every cost when given no profile, while the CLI measured."""
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.workflows.resolve import Choices, resolve

    labels: list[str] = []
    few = ProfileOptions(runs=3)  # and --runs 3: how many runs is not what differed
    edgesplit.partition(
        tiny, local, profiling=few, progress=lambda label, done, total: labels.append(label)
    )
    assert "cpu/ort" in labels  # measured here, as the CLI does
    api = resolve(tiny, local, Choices(profiling=few)).profile
    code, _, err = run(
        capsys,
        "partition",
        str(tiny),
        "-d",
        str(local),
        "--runs",
        "3",
        "-o",
        str(tmp_path / "p.json"),
        "-q",
    )
    assert code == 0, err
    cli = json.loads((tmp_path / "p.profile.json").read_text())
    assert [(e.key, e.source) for e in api.entries] == [
        (f"{e['processor']}/{e['backend']}", e["source"]) for e in cli["entries"]
    ]
    assert api.entry("cpu", "ort").source == "measured"


@pytest.mark.slow
def test_every_objective_is_offered_everywhere(capsys, tiny, board, local, tmp_path):
    """The API had 5 objectives, ``partition`` 4 and ``deploy`` 3."""
    for cmd in ("partition", "deploy"):
        code, out, _ = run(capsys, cmd, "--help")
        assert code == 0
        for name in OBJECTIVES:
            assert name in out, (cmd, name)
    for name in OBJECTIVES:
        code, _, err = run(
            capsys,
            "partition",
            str(tiny),
            "-d",
            str(board),
            "--objective",
            name,
            "-q",
            "-o",
            str(tmp_path / f"{name}.json"),
        )
        assert code == 0, (name, err)
        assert json.loads((tmp_path / f"{name}.json").read_text())["objective"] == name
    code, _, err = run(
        capsys,
        "deploy",
        str(tiny),
        "-d",
        str(local),
        "--objective",
        "pareto",
        "--runs",
        "3",
        "-o",
        str(tmp_path / "b"),
    )
    assert code == 0, err
    assert (
        json.loads((tmp_path / "b" / "manifest.json").read_text())["plan"]["objective"] == "pareto"
    )
    with pytest.raises(
        PlanError, match=r"unknown objective 'speed' \(objectives: latency, latency_sequential"
    ):
        edgesplit.partition(tiny, board, objective="speed")


def test_pins_have_one_parser_and_one_error(capsys, tiny, board, tmp_path):
    """``--pin`` was split at the first ``=`` by deploy and at the last by partition, with two
    different messages."""
    errors = set()
    for cmd in ("partition", "deploy"):
        code, _, err = run(
            capsys, cmd, str(tiny), "-d", str(board), "--pin", "oops", "-o", str(tmp_path / cmd)
        )
        assert code == 2
        errors.add(err.strip())
    assert errors == {"edgesplit: error: --pin 'oops' is not NODE=PROC"}
    from edgesplit.workflows.resolve import parse_pins

    assert parse_pins(["a=b=cpu", "c=gpu"]) == {"a=b": "cpu", "c": "gpu"}  # node names may hold "="
    assert parse_pins({"x": "cpu"}) == {"x": "cpu"}


def test_compile_uses_the_spec_file_the_plan_was_made_with(capsys, tiny, board, tmp_path):
    """After ``partition -d spec.yaml``, ``compile`` failed with "unknown device" (it looked the
    plan's device up by name)."""
    plan = tmp_path / "plan.json"
    code, _, err = run(capsys, "partition", str(tiny), "-d", str(board), "-o", str(plan), "-q")
    assert code == 0, err
    code, _, err = run(
        capsys, "compile", str(tiny), "--plan", str(plan), "-o", str(tmp_path / "bundle")
    )
    assert code == 0, err
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["device"] == "pathboard"


def test_the_agent_reads_its_spec_like_load_device(tmp_path, tiny):
    """The remote agent built its DeviceSpec with a copy of ``load_device`` that skipped the link
    check (``device_from_dict``); now both use ``device_from_mapping``."""
    from edgesplit.profile.agent import Agent

    data = yaml.safe_load(Path(edgesplit.load_device("host-biglittle").path).read_text())
    data["links"] = [{"between": ["big", "nope"], "bandwidth_gbps": 1, "latency_ms": 0}]
    work = tmp_path / "agent"
    work.mkdir()
    (work / "model.onnx").write_bytes(tiny.read_bytes())
    agent = Agent(str(work), io.BytesIO(), io.BytesIO())
    msg = {
        "op": "profile",
        "model": "model.onnx",
        "device": data,
        "options": {"runs": 1, "warmup": 0},
    }
    with pytest.raises(DeviceSpecError, match="links.0.between: unknown processor 'nope'"):
        agent.profile(msg)


def test_resolve_checks_cheap_things_before_loading(tmp_path):
    """Bad flags fail before the model is read (the model path here does not exist)."""
    from edgesplit.workflows.resolve import Choices, resolve

    missing = tmp_path / "nope.onnx"
    with pytest.raises(PlanError, match="unknown objective"):
        resolve(missing, "host", Choices(objective="fast"))
    with pytest.raises(PlanError, match="--slo-ms must be positive"):
        resolve(missing, "host", Choices(slo_ms=0))
    with pytest.raises(PlanError, match="is not NODE=PROC"):
        resolve(missing, "host", Choices(pins=["x"]))
    with pytest.raises(PlanError, match="need --server"):
        resolve(missing, "host", Choices(rtt_ms=3))


def test_a_pin_on_an_unknown_node_or_processor_is_refused_before_measuring(
    tiny, local, monkeypatch
):
    """An unknown node or processor in the pins was found when the cost model was built, after
    the local processors had been measured (seconds to minutes on a real model)."""
    import edgesplit.workflows.resolve
    from edgesplit.workflows.resolve import Choices, resolve

    def measured(*a, **k):
        raise AssertionError("measured before the pins were checked")

    monkeypatch.setattr(edgesplit.workflows.resolve, "profile_model", measured)
    for pins, words in (
        (["nosuchnode=cpu"], "unknown node 'nosuchnode'"),
        ([f"{_first_node(tiny)}=npu"], "unknown processor 'npu'"),
    ):
        with pytest.raises(PlanError, match=words):
            resolve(tiny, local, Choices(pins=pins))


def _first_node(model: Path) -> str:
    return edgesplit.load_model(model).nodes[0].name


def test_commands_check_flags_before_loading(capsys, tmp_path):
    """partition and deploy load the model before resolving (to print what loading changed), but
    bad flags still fail first: the model here does not exist."""
    missing = str(tmp_path / "nope.onnx")
    for cmd in ("partition", "deploy"):
        for flag, msg in (
            (["--pin", "x"], "is not NODE=PROC"),
            (["--rtt-ms", "3"], "need --server"),
        ):
            code, _, err = run(capsys, cmd, missing, *flag, "-o", str(tmp_path / cmd))
            assert code == 2 and msg in err and "nope.onnx" not in err, (cmd, flag, err)


def test_a_server_must_be_a_server_and_a_link_gets_its_overrides(tiny, board):
    from edgesplit.workflows.resolve import Choices, resolve

    with pytest.raises(PlanError, match="'host' is a device spec, not a server"):
        resolve(tiny, board, Choices(server="host"))
    problem = resolve(
        tiny, board, Choices(server="server-a100", link="lte", bandwidth_mbps=7, rtt_ms=11)
    )
    assert (problem.link.up_mbps, problem.link.down_mbps, problem.link.rtt_ms) == (7, 7, 11)
    assert problem.link.name == "lte@7mbps"
    assert [p.name for p in problem.full_device.processors][-1].startswith("server-a100.")


def test_problem_from_plan_loads_what_the_plan_recorded(tiny, board, tmp_path):
    from edgesplit.workflows.resolve import problem_from_plan, resolve

    prof = resolve(tiny, board).profile
    prof.save(tmp_path / "p.json")
    plan = edgesplit.partition(
        tiny, board, server="server-a100", profile=tmp_path / "p.json", pins={}
    )
    problem = problem_from_plan(plan)
    assert problem.device.path == os.fspath(board) and problem.server.name == "server-a100"
    assert problem.profile_path == os.path.abspath(tmp_path / "p.json")
    assert problem.link == plan.link


def test_edgesplit_deploy_stays_the_function(capsys, tmp_path):
    """``edgesplit.deploy`` was the module ``edgesplit/deploy.py`` once anything imported it (the
    ``deploy`` command does), so the README's ``edgesplit.deploy(...)`` failed after it."""
    run(capsys, "deploy", "--help")
    assert callable(edgesplit.deploy)
