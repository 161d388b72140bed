"""The emulated aarch64 board (``scripts/arm64-board.sh``) as a pytest fixture.

The fixture builds the board when its cache is missing or stale (once per machine: 9-17 minutes
on this 2-core machine while shared, about 6 minutes of CPU time; README has the figures), then
starts the board's own sshd under qemu on a free port of 127.0.0.1 with a fresh
host key and client key, and stops it after the module. The board's ``/tmp`` is a host folder
(``Board.tmp``), so a test can check that the remote agent left nothing there. A machine that
cannot run the board at all (not root, no binfmt_misc) skips, with the script's reason.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paramiko
import pytest
from conftest import REPO
from sshd import free_port

SCRIPT = REPO / "scripts" / "arm64-board.sh"
BOARD_PYTHON = "/usr/bin/python3"
BUILD_TIMEOUT_S = 1800  # 1.8x the slowest build measured here (README: "Real targets")
CANNOT = 3  # the script's exit code for "this machine cannot run the board"


@dataclass
class Board:
    """One running board: its sshd and what a client needs to reach it."""

    state: Path
    port: int
    proc: subprocess.Popen | None = None
    user: str = "root"

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    @property
    def identity(self) -> Path:
        return self.state / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    @property
    def tmp(self) -> Path:
        """The board's /tmp, seen from the host."""
        return self.state / "tmp"

    def cli_args(self, *extra: str) -> list[str]:
        """The ssh flags of ``edgesplit profile`` / ``devices detect`` for this board."""
        return [
            "--remote",
            self.target,
            "--identity",
            str(self.identity),
            "--known-hosts",
            str(self.known_hosts),
            "--remote-python",
            BOARD_PYTHON,
            *extra,
        ]

    def start(self, timeout_s: float = 120) -> None:
        log = self.state.parent / f"{self.state.name}.start.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", str(SCRIPT), "start", str(self.state), str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.settimeout(20)
                    if s.recv(64).startswith(b"SSH-"):  # the banner: sshd runs, not just binds
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        tail = log.read_text(errors="replace")[-2000:]
        sshd_log = self.state / "sshd.log"
        if sshd_log.exists():
            tail += sshd_log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the board's sshd did not start: {tail}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # unshare, then its pid namespace, go down
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None

    def connect(self) -> paramiko.SSHClient:
        """A paramiko client checked against the board's host key (no auto-accept)."""
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            "127.0.0.1",
            self.port,
            self.user,
            key_filename=str(self.identity),
            look_for_keys=False,
            allow_agent=False,
            timeout=30,
            banner_timeout=60,
            auth_timeout=60,
        )
        return client


def build_board() -> None:
    """Build (or find current) the cached board; skip when this machine cannot run it."""
    if os.geteuid() != 0:
        pytest.skip("the emulated aarch64 board needs root (debootstrap, chroot, mounts)")
    r = subprocess.run(
        ["bash", str(SCRIPT), "build"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "PYTHON": sys.executable},  # its pip, and its versions for the board
    )
    if r.returncode == CANNOT:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, f"scripts/arm64-board.sh build failed:\n{r.stderr[-4000:]}"


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    build_board()
    b = Board(tmp_path_factory.mktemp("board"), free_port())
    b.start()
    yield b
    b.stop()


# Runs on the board, in the folder the test shipped: edgesplit's sources under src/, the bundle,
# the inputs as .npy files named by index (names.json), and this script. Writes the outputs the
# same way, and what it saw (machine, parts, notes) in facts.json.
RUN_BUNDLE = """\
import json, os, platform, sys
import numpy as np
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "src"))
import edgesplit
names = json.load(open(os.path.join(here, "names.json")))
feeds = {
    n: np.load(os.path.join(here, "in", f"{i}.npy"), allow_pickle=False)
    for i, n in enumerate(names)
}
with edgesplit.load(os.path.join(here, "bundle")) as sess:
    out = sess.run(feeds)
    parts = [
        {"name": p.name, "backend": p.backend, "processor": p.processor}
        for p in sess.manifest.parts
    ]
    notes = list(sess.stats().notes)
os.mkdir(os.path.join(here, "out"))
for i, n in enumerate(sorted(out)):
    np.save(os.path.join(here, "out", f"{i}.npy"), out[n], allow_pickle=False)
json.dump({"machine": platform.machine(), "outputs": sorted(out), "parts": parts, "notes": notes},
          open(os.path.join(here, "facts.json"), "w"))
"""


def _ship(bundle: Path, feeds: Mapping[str, np.ndarray]) -> bytes:
    """A tar.gz of edgesplit's sources, the bundle, the inputs and the run script."""
    buf = io.BytesIO()

    def add(name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted((REPO / "edgesplit").rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                add(f"src/{f.relative_to(REPO).as_posix()}", f.read_bytes())
        for f in sorted(bundle.rglob("*")):
            if f.is_file():
                add(f"bundle/{f.relative_to(bundle).as_posix()}", f.read_bytes())
        add("names.json", json.dumps(list(feeds)).encode())
        for i, arr in enumerate(feeds.values()):
            b = io.BytesIO()
            np.save(b, arr, allow_pickle=False)
            add(f"in/{i}.npy", b.getvalue())
        add("run.py", RUN_BUNDLE.encode())
    return buf.getvalue()


def _exec(client: paramiko.SSHClient, cmd: str, timeout_s: float = 900) -> str:
    _, out, err = client.exec_command(cmd, timeout=timeout_s)
    text, code = out.read().decode(), out.channel.recv_exit_status()
    if code != 0:
        raise RuntimeError(f"on the board, {cmd!r} exited {code}: {err.read().decode()[-3000:]}")
    return text


def run_bundle(
    board: Board, bundle: Path, feeds: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict]:
    """Run ``bundle`` on the board with edgesplit's runtime (its sources shipped over SFTP).

    Returns the outputs by name and the facts the board reported; the remote folder is removed.
    """
    client = board.connect()
    try:
        d = _exec(client, "mktemp -d /tmp/edgesplit-run.XXXXXXXX").strip()
        q = shlex.quote(d)
        try:
            with client.open_sftp() as sftp:
                sftp.putfo(io.BytesIO(_ship(bundle, feeds)), f"{d}/ship.tgz")
                # TMPDIR: onnxruntime leaves a .ses file there
                _exec(client, f"cd {q} && tar xzf ship.tgz && TMPDIR={q} {BOARD_PYTHON} run.py")
                facts = json.loads(sftp.open(f"{d}/facts.json").read())
                outs = {}
                for i, name in enumerate(facts["outputs"]):
                    outs[name] = np.load(
                        io.BytesIO(sftp.open(f"{d}/out/{i}.npy").read()), allow_pickle=False
                    )
        finally:
            _exec(client, f"rm -rf -- {q}")
    finally:
        client.close()
    return outs, facts
