"""``edgesplit partition`` and ``edgesplit explain``: outputs, and one-line errors with exit code
2."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from edgesplit.cli.main import main
from edgesplit.model import zoo

DEVICE_YAML = """\
name: testboard
kind: device
memory_mb: 4096
processors:
  cpu:
    kind: cpu
    peak_gflops: 20
    mem_bandwidth_gbps: 8
    active_w: 3.0
    idle_w: 0.3
    ops: {{exclude: [{cpu_exclude}]}}
    backends:
      - runtime: ort
  gpu:
    kind: gpu
    peak_gflops: 200
    mem_bandwidth_gbps: 20
    launch_overhead_ms: 0.05
    active_w: 4.0
    idle_w: 0.2
    ops: {{exclude: [{gpu_exclude}]}}
    backends:
      - runtime: ort
        provider: CUDAExecutionProvider
"""


def _device(tmp_path: Path, cpu_exclude: str = "Loop", gpu_exclude: str = "Loop") -> str:
    p = tmp_path / "testboard.yaml"
    p.write_text(DEVICE_YAML.format(cpu_exclude=cpu_exclude, gpu_exclude=gpu_exclude))
    return str(p)


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def tiny_dag(tmp_path) -> Path:
    return zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")


@pytest.mark.slow
def test_partition_writes_plan_onnx_and_plot(tmp_path, capsys, tiny_dag):
    plan_path = tmp_path / "out" / "plan.json"
    code, out, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        _device(tmp_path),
        "--server",
        "server-a100",
        "--link",
        "wifi",
        "--bandwidth-mbps",
        "50",
        "--plot",
        str(tmp_path / "plan.png"),
        "-o",
        str(plan_path),
    )
    assert code == 0, err
    assert "best-single-cut" in out and "server-only" in out and "ort-greedy" in out
    data = json.loads(plan_path.read_text())
    assert list(data)[:4] == ["format_version", "model_sha256", "model_name", "model_path"]
    assert data["format_version"] == 1 and data["server"] == "server-a100"
    assert {"latency_ms", "energy_mj", "throughput_per_s"} <= set(data["predicted"])
    assert set(data["parts"][0]) >= {
        "name",
        "processor",
        "backend",
        "remote",
        "nodes",
        "inputs",
        "outputs",
        "latency_ms",
        "energy_mj",
        "start_ms",
        "end_ms",
        "stage",
    }
    model = onnx.load(str(plan_path.with_suffix(".onnx")))
    for node in model.graph.node:
        meta = {e.key: e.value for e in node.metadata_props}
        assert meta["edgesplit.processor"] == data["assignment"][node.name]["processor"]
        assert meta["edgesplit.part"].startswith("p")
    assert (tmp_path / "plan.png").stat().st_size > 1000
    from edgesplit.optimize import load_plan

    plan = load_plan(plan_path)
    assert json.loads(json.dumps(plan.to_json())) == data

    code, out, err = run(
        capsys,
        "explain",
        str(plan_path),
        "--bandwidth-sweep",
        "--per-decade",
        "2",
        "--plot",
        str(tmp_path / "sweep.png"),
    )
    assert code == 0, err
    assert "1000" in out and "0.1" in out and "decision" in out
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_unsupported_ops_are_all_listed(tmp_path, capsys, tiny_dag):
    dev = _device(tmp_path, cpu_exclude="Concat, Gemm", gpu_exclude="Concat, Gemm")
    code, _, err = run(
        capsys, "partition", str(tiny_dag), "--device", dev, "-o", str(tmp_path / "p.json")
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "Concat" in err and "Gemm" in err


def test_unknown_processor_in_pin(tmp_path, capsys, tiny_dag):
    code, _, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        _device(tmp_path),
        "--pin",
        "x=tpu",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown" in err
    from edgesplit.model.load import load_model

    node = load_model(tiny_dag).nodes[0].name
    code, _, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        _device(tmp_path),
        "--pin",
        f"{node}=tpu",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert code == 2 and "unknown processor 'tpu'" in err and "cpu, gpu" in err


def test_impossible_slo_names_the_best_latency(tmp_path, capsys, tiny_dag):
    code, _, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        _device(tmp_path),
        "--objective",
        "energy",
        "--slo-ms",
        "0.0001",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "best achievable latency is" in err


def test_profile_of_another_model(tmp_path, capsys, tiny_dag):
    other = zoo.save("chain_shrink", tmp_path / "other.onnx")
    prof = tmp_path / "other.profile.json"
    code, _, err = run(
        capsys, "profile", str(other), "--device", _device(tmp_path), "-o", str(prof), "-q"
    )
    assert code == 0, err
    code, _, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        _device(tmp_path),
        "--profile",
        str(prof),
        "-o",
        str(tmp_path / "p.json"),
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "profile is for model" in err


def test_plan_of_another_model(tmp_path, capsys, tiny_dag):
    plan_path = tmp_path / "plan.json"
    code, _, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        _device(tmp_path),
        "--server",
        "server-a100",
        "-o",
        str(plan_path),
        "-q",
    )
    assert code == 0, err
    zoo.save("tiny_dag", tiny_dag, seed=1)  # same path, other weights: another hash
    code, _, err = run(capsys, "explain", str(plan_path), "--bandwidth-sweep")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "the plan is for model" in err


def test_bad_plan_file_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format_version": 1, "parts": []}')
    code, _, err = run(capsys, "explain", str(bad))
    assert code == 2 and str(bad) in err


def test_annotated_copy_never_overwrites_the_model(tmp_path, capsys, tiny_dag):
    before = tiny_dag.read_bytes()
    code, _, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        _device(tmp_path),
        "-o",
        str(tiny_dag.with_suffix(".json")),
        "-q",
    )
    assert code == 0, err
    assert tiny_dag.read_bytes() == before
    assert tiny_dag.with_suffix(".annotated.onnx").is_file()


@pytest.mark.slow
def test_backend_chooses_what_partition_and_deploy_measure(tmp_path, capsys, tiny_dag):
    """``--backend ort`` measures only ORT on ``host-biglittle`` (whose processors also offer TVM,
    minutes of compiling per model): the kept profile has ORT entries alone, and TVM, measured
    nowhere, is no candidate. With ``--profile`` nothing is measured: refused, one line, exit 2."""
    code, _, err = run(
        capsys,
        "partition",
        str(tiny_dag),
        "--device",
        "host-biglittle",
        "--backend",
        "ort",
        "--runs",
        "3",
        "-o",
        str(tmp_path / "p.json"),
        "-q",
    )
    assert code == 0, err
    prof = json.loads((tmp_path / "p.profile.json").read_text())
    want = {("big", "ort"), ("little", "ort"), ("big+little", "ort")}  # the core group: ORT only
    assert {(e["processor"], e["backend"]) for e in prof["entries"]} == want
    assert {c["runs"] for e in prof["entries"] for c in e["nodes"].values()} == {
        3
    }  # --runs, as deploy's
    plan = json.loads((tmp_path / "p.json").read_text())
    assert {a["backend"] for a in plan["assignment"].values()} == {"ort"}
    code, out, err = run(
        capsys,
        "deploy",
        str(tiny_dag),
        "--device",
        "host-biglittle",
        "--backend",
        "ort",
        "--runs",
        "3",
        "--no-verify",
        "-o",
        str(tmp_path / "b"),
    )
    assert code == 0, err
    kept = json.loads((tmp_path / "b.profile.json").read_text())
    assert {e["backend"] for e in kept["entries"]} == {"ort"}
    for command in ("partition", "deploy"):
        code, _, err = run(
            capsys,
            command,
            str(tiny_dag),
            "--device",
            "host-biglittle",
            "--backend",
            "ort",
            "--profile",
            str(tmp_path / "p.profile.json"),
            "-o",
            str(tmp_path / f"x-{command}"),
        )
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
        assert "--backend chooses what to measure, but --profile is given" in err
        code, _, err = run(
            capsys, command, str(tiny_dag), "--backend", "nosuch", "-o", str(tmp_path / "y")
        )
        assert code == 2 and "nosuch" in err and "Traceback" not in err, (command, err)
    # a backend the device offers nowhere: refused, not a plan made of predictions alone
    for command in ("partition", "deploy", "profile"):
        code, _, err = run(
            capsys,
            command,
            str(tiny_dag),
            "--device",
            "host-2core",
            "--backend",
            "tvm",
            "-o",
            str(tmp_path / f"z-{command}"),
        )
        assert (
            code == 2 and "host-2core: no processor offers backend 'tvm' (its backends: ort)" in err
        ), err
        assert not (tmp_path / f"z-{command}").exists()


def test_the_progress_bar_shows_only_work_and_a_failure_leaves_none(capsys):
    """``partition`` draws the bar that ``deploy`` does: written to a file, a command with nothing
    to show writes nothing (not an empty line), one that fails leaves no bar above its error, and
    one that ends well leaves each row's last state."""
    from edgesplit.cli.common import progress_bar

    with progress_bar():
        pass
    assert capsys.readouterr().err == ""
    with pytest.raises(RuntimeError), progress_bar() as update:
        update("profiling", 1, 4)
        raise RuntimeError("stop")
    assert capsys.readouterr().err == ""
    with progress_bar() as update:
        update("profiling", 3, 4)
        update("accuracy budget", 2, 2)
    err = capsys.readouterr().err
    assert "profiling" in err and "3/4" in err and "accuracy budget" in err and "2/2" in err
