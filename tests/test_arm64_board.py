"""On the emulated aarch64 board (scripts/arm64-board.sh): remote profiling, and a Raspberry Pi 5
bundle with TVM parts cross-compiled here that runs there and reproduces the x86 outputs."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnxruntime as ort
import pytest
from board import BOARD_PYTHON, BUILD_TIMEOUT_S, board, run_bundle  # noqa: F401 - fixture
from conftest import run_cli

from edgesplit.compile.manual import contiguous_plan
from edgesplit.device.detect import emulation
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.remote import detect_remote
from edgesplit.profile.ssh import SshOptions
from edgesplit.profile.store import Profile, load_profile
from edgesplit.workflows.compile import compile_bundle


def on_board(test):
    """Slow, on the board; the first such test may build it (its fixture), which pytest-timeout
    counts against the test."""
    for mark in (pytest.mark.slow, pytest.mark.board, pytest.mark.timeout(BUILD_TIMEOUT_S + 1200)):
        test = mark(test)
    return test


EM_AARCH64 = 183  # ELF e_machine
SLOW_SSH = ("--connect-timeout", "120", "--step-timeout", "600")  # every byte of crypto is emulated


X86_CPUINFO = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nflags\t\t: fpu sse2 avx2\n"
)
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd0b\n"


@pytest.mark.parametrize(
    "machine, cpuinfo, emulated",
    [
        ("aarch64", X86_CPUINFO, True),
        ("aarch64", ARM_CPUINFO, False),
        ("x86_64", X86_CPUINFO, False),
    ],
)
def test_emulation_is_told_by_cpuinfo_that_disagrees_with_the_machine(
    machine, cpuinfo, emulated, tmp_path
):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(cpuinfo)
    why = emulation(tmp_path, machine=machine)
    assert bool(why) == emulated and (
        not why or why.startswith(f"emulated: {machine} code on an x86 CPU")
    )


def test_the_emulated_flag_survives_a_profile_file_and_old_files_read_as_native(tmp_path):
    prof = Profile(
        "0" * 64, "m", "raspberry-pi5", {"x": (1, 3)}, (), emulated="emulated: aarch64 code ..."
    )
    prof.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == prof
    data = json.loads((tmp_path / "p.json").read_text())
    del data["emulated"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_profile(tmp_path / "old.json").emulated == ""
    assert emulation() == ""  # this test machine runs natively


@on_board
def test_remote_profile_on_the_board_is_flagged_emulated(board, tmp_path):  # noqa: F811
    model = zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")
    out = tmp_path / "board.profile.json"
    r = run_cli(
        "profile",
        str(model),
        *board.cli_args(*SLOW_SSH),
        "--device",
        "raspberry-pi5",
        "--backend",
        "ort",
        "--runs",
        "3",
        "--warmup",
        "1",
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    prof = load_profile(out)
    assert prof.emulated.startswith("emulated: aarch64 code on an x86 CPU"), prof.emulated
    assert "note: emulated: aarch64" in r.stdout and "EMULATED" in r.stdout
    entry = prof.entry("cpu", "ort")
    assert entry is not None and entry.source == "measured" and entry.whole_model_ms > 0
    assert set(entry.nodes) == {n.name for n in load_model(model).nodes}
    assert prof.device == "raspberry-pi5" and prof.host == "arm64-board"
    assert not list(board.tmp.iterdir()), "the agent left its folder on the board"

    opts = SshOptions(
        identity=str(board.identity),
        known_hosts=str(board.known_hosts),
        remote_python=BOARD_PYTHON,
        connect_timeout_s=120,
        step_timeout_s=600,
    )
    facts = detect_remote(board.target, opts)
    assert facts["machine"] == "aarch64" and facts["emulated"].startswith("emulated: aarch64")
    assert facts["modules"]["onnxruntime"] == ort.__version__ and facts["modules"]["tvm"]


@on_board
def test_pi5_bundle_with_tvm_parts_runs_on_the_board_like_x86(board, tmp_path):  # noqa: F811
    path = zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")
    graph = load_model(path)
    plan = contiguous_plan(graph, "raspberry-pi5", [("cpu", "tvm"), ("cpu", "ort"), ("cpu", "tvm")])
    m = compile_bundle(graph, plan, tmp_path / "bundle", device="raspberry-pi5")
    assert [p.backend for p in m.parts] == ["tvm", "ort", "tvm"], [p.note for p in m.parts]
    for p in m.parts:
        if p.backend == "tvm":
            assert p.target["mtriple"] == "aarch64-linux-gnu" and p.target["mcpu"] == "cortex-a76"
            head = (tmp_path / "bundle" / p.file).read_bytes()[:20]
            assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == EM_AARCH64

    rng = np.random.default_rng(7)
    feeds = {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))

    got, facts = run_bundle(board, tmp_path / "bundle", feeds)
    assert not list(board.tmp.iterdir()), "the run left its folder on the board"
    assert facts["machine"] == "aarch64"
    assert [(p["name"], p["backend"]) for p in facts["parts"]] == [
        ("p0", "tvm"),
        ("p1", "ort"),
        ("p2", "tvm"),
    ]
    assert set(got) == set(want)
    for name, w in want.items():
        err = float(np.max(np.abs(got[name] - w)))
        assert err <= 1e-4 * float(np.max(np.abs(w))) + 1e-6, (name, err)
    print(f"board: max abs error vs x86 {err:.1e}; parts {facts['parts']}", file=sys.stderr)
