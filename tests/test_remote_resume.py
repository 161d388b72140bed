"""A connection dropped mid-run, --resume, and Ctrl-C: over a real sshd, through the real CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sshd import remote_tmp, sshd  # noqa: F401 - fixtures

from edgesplit.model import zoo
from edgesplit.profile.store import load_profile


def cli(*args: str) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("edgesplit")
    return subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory) -> Path:
    # ORT takes ~0.3 s on it and TVM several seconds: time enough to break the connection in between
    return zoo.save("squeezenet", tmp_path_factory.mktemp("models") / "squeezenet.onnx")


def test_dropped_connection_then_resume_reuses_the_measured_pairs(sshd, remote_tmp, squeezenet, tmp_path):  # noqa: F811
    out = tmp_path / "sq.json"
    part = Path(f"{out}.partial")
    args = [
        "profile",
        str(squeezenet),
        *sshd.cli_args(remote_tmp),
        "--runs",
        "3",
        "--warmup",
        "1",
        "-o",
        str(out),
    ]
    p = cli(*args)
    wait_for(lambda: part.exists() or p.poll() is not None, 60, "the first checkpoint")
    assert p.poll() is None, p.communicate()
    assert sshd.kill_connections() > 0  # the sshd processes serving us die: a dropped connection
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("edgesplit: error: ") and "Traceback" not in err
    assert sshd.target in line and "connection dropped" in line and "--resume" in line and str(part) in line
    saved = load_profile(part)
    assert [e.key for e in saved.entries] == ["cpu/ort"] and not out.exists()
    assert saved.entry("cpu", "ort").dispatch_ms is not None  # checkpoints keep every field

    p = cli(*args, "--resume")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    prof = load_profile(out)
    assert [e.key for e in prof.entries] == ["cpu/ort", "cpu/tvm"]
    assert prof.entry("cpu", "ort") == saved.entry("cpu", "ort")  # reused as measured, not measured again
    assert prof.entry("cpu", "tvm").nodes and not part.exists()


def test_ctrl_c_removes_the_remote_folder(sshd, remote_tmp, squeezenet, tmp_path):  # noqa: F811
    out = tmp_path / "sq.json"
    p = cli("profile", str(squeezenet), *sshd.cli_args(remote_tmp), "--backend", "tvm", "-o", str(out))
    wait_for(lambda: any(remote_tmp.iterdir()) or p.poll() is not None, 60, "the remote folder")
    time.sleep(1.0)  # into the profiling
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == "edgesplit: error: interrupted"
    assert not out.exists()
    # the client removed the folder before exiting, not just the agent afterwards
    assert not any(remote_tmp.iterdir()), list(remote_tmp.iterdir())


def test_local_resume_keeps_the_saved_pairs_too(tmp_path):
    from conftest import run_cli

    model = zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")
    first = tmp_path / "first.json"
    r = run_cli(
        "profile", str(model), "--backend", "ort", "--runs", "2", "--warmup", "1", "-q", "-o", str(first)
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.json"
    Path(f"{out}.partial").write_text(first.read_text())  # as if the run had stopped after cpu/ort
    r = run_cli("profile", str(model), "--runs", "2", "--warmup", "1", "-q", "-o", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    prof = load_profile(out)
    assert [e.key for e in prof.entries] == ["cpu/ort", "cpu/tvm"]
    assert prof.entry("cpu", "ort") == load_profile(first).entry("cpu", "ort")
    assert not Path(f"{out}.partial").exists()
