"""A connection dropped mid-run, --resume, and Ctrl-C: over a real sshd, through the real CLI."""

from __future__ import annotations

import codecs
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sshd import remote_tmp, sshd  # noqa: F401 - fixtures

from edgesplit.model import zoo
from edgesplit.profile.store import load_profile


class Cli:
    """The real console script in a subprocess, its stderr read as it comes.

    ``TTY_COMPATIBLE=1`` makes rich draw its live progress bar into the pipe, so the test sees
    the same progress events a user sees (``cpu/tvm ... 3/66``) and can wait on them.
    """

    def __init__(self, *args: str):
        exe = Path(sys.executable).with_name("edgesplit")
        env = {
            **os.environ,
            "TTY_COMPATIBLE": "1",
            "NO_COLOR": "1",
            "TERM": "xterm",
            "COLUMNS": "200",
        }
        # SIGINT as a terminal delivers it, even when this process ignores it (a runner started in
        # the background by a shell without job control, or a test before this one, may have set
        # SIG_IGN, which the CLI would inherit and then never see Ctrl-C)
        self.proc = subprocess.Popen(
            [str(exe), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self._text = ""
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # whatever the pipe holds at once, not a character at a time: the live bar redraws itself
        # many times a second, and a reader that falls behind it sees progress after the run ended
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        fd = self.proc.stderr.fileno()
        while chunk := os.read(fd, 65536):
            with self._changed:
                self._text += decode(chunk)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_progress(self, label: str, timeout_s: float = 120) -> None:
        """Block until the progress bar shows ``label`` with at least one step done."""
        pattern = re.compile(rf"{re.escape(label)}\s[^\r\n]*?\b([1-9]\d*)/\d+\b")
        with self._changed:
            ok = self._changed.wait_for(
                lambda: pattern.search(self._text) or self.proc.poll() is not None, timeout_s
            )
        assert ok and self.proc.poll() is None, f"no progress on {label}: {self.stderr()[-2000:]}"

    def finish(self, timeout_s: float = 120) -> str:
        """Wait for the exit; the stderr lines, progress drawing removed."""
        self.proc.wait(timeout_s)
        self._reader.join(timeout_s)
        return self.stderr()

    def stderr(self) -> str:
        with self._changed:
            text = self._text
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "\n")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    # ORT takes well under a second on it and TVM seconds (a module built per fused kernel): time
    # enough to break the connection in between
    return zoo.save("tiny_dag", tmp_path_factory.mktemp("models") / "tiny_dag.onnx")


@pytest.mark.ssh
def test_dropped_connection_then_resume_reuses_the_measured_pairs(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    out = tmp_path / "sq.json"
    part = Path(f"{out}.partial")
    args = [
        "profile",
        str(tiny),
        *sshd.cli_args(remote_tmp),
        "--runs",
        "3",
        "--warmup",
        "1",
        "-o",
        str(out),
    ]
    p = Cli(*args)
    p.wait_progress("cpu/tvm")  # cpu/ort is done and checkpointed; TVM is being measured
    assert part.exists()
    assert sshd.kill_connections() > 0  # the sshd processes serving us die: a dropped connection
    err = p.finish(60)
    assert p.proc.returncode == 1, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("edgesplit: error: ") and "Traceback" not in err
    assert (
        sshd.target in line
        and "connection dropped" in line
        and "--resume" in line
        and str(part) in line
    )
    saved = load_profile(part)
    assert [e.key for e in saved.entries] == ["cpu/ort"] and not out.exists()
    assert saved.entry("cpu", "ort").dispatch_ms is not None  # checkpoints keep every field

    p = Cli(*args, "--resume")
    err = p.finish(120)
    assert p.proc.returncode == 0, err
    prof = load_profile(out)
    assert [e.key for e in prof.entries] == ["cpu/ort", "cpu/tvm"]
    assert prof.entry("cpu", "ort") == saved.entry(
        "cpu", "ort"
    )  # reused as measured, not measured again
    assert prof.entry("cpu", "tvm").nodes and not part.exists()


@pytest.mark.ssh
def test_ctrl_c_removes_the_remote_folder(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    out = tmp_path / "sq.json"
    p = Cli("profile", str(tiny), *sshd.cli_args(remote_tmp), "--backend", "tvm", "-o", str(out))
    p.wait_progress("cpu/tvm")  # the agent is measuring: the remote folder exists and is in use
    assert any(remote_tmp.iterdir())
    p.proc.send_signal(signal.SIGINT)
    err = p.finish(60)
    assert p.proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "edgesplit: error: interrupted"
    assert not out.exists()
    # the client removed the folder before exiting, not just the agent afterwards
    assert not any(remote_tmp.iterdir()), list(remote_tmp.iterdir())


@pytest.mark.slow
def test_local_resume_keeps_the_saved_pairs_too(tmp_path):
    from conftest import run_cli

    model = zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")
    first = tmp_path / "first.json"
    r = run_cli(
        "profile",
        str(model),
        "--backend",
        "ort",
        "--runs",
        "2",
        "--warmup",
        "1",
        "-q",
        "-o",
        str(first),
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.json"
    Path(f"{out}.partial").write_text(first.read_text())  # as if the run had stopped after cpu/ort
    r = run_cli(
        "profile", str(model), "--runs", "2", "--warmup", "1", "-q", "-o", str(out), "--resume"
    )
    assert r.returncode == 0, r.stderr
    prof = load_profile(out)
    assert [e.key for e in prof.entries] == ["cpu/ort", "cpu/tvm"]
    assert prof.entry("cpu", "ort") == load_profile(first).entry("cpu", "ort")
    assert not Path(f"{out}.partial").exists()
