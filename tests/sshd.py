"""A real OpenSSH sshd on 127.0.0.1 for the remote-profiling tests.

Each server runs as an ordinary process with its own config, host key, authorized key and pid
file in a temporary folder (DESIGN.md, measured facts). The remote Python is this venv's, and the
agent's temporary folders go under a known ``remote_tmp`` folder (``--remote-tmpdir``), which the
``remote_tmp`` fixture checks is empty after every test.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {dir}/host_ed25519
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
MaxStartups 50
LogLevel VERBOSE
"""


def keygen(path: Path, comment: str = "edgesplit-test") -> Path:
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Sshd:
    """One running sshd and the files a client needs to reach it."""

    dir: Path
    port: int
    user: str
    identity: Path  # the authorised client key
    known_hosts: Path  # holds this server's host key
    proc: subprocess.Popen | None = None

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    @property
    def host_pub(self) -> str:
        return (self.dir / "host_ed25519.pub").read_text().split()[:2]

    def cli_args(self, remote_tmp: Path, *extra: str) -> list[str]:
        """The ssh flags of ``edgesplit profile/devices detect`` for this server."""
        return [
            "--remote",
            self.target,
            "--identity",
            str(self.identity),
            "--known-hosts",
            str(self.known_hosts),
            "--remote-python",
            sys.executable,
            "--remote-tmpdir",
            str(remote_tmp),
            *extra,
        ]

    def start(self) -> None:
        (self.dir / "sshd_config").write_text(CONFIG.format(port=self.port, dir=self.dir))
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(SSHD), "-D", "-f", str(self.dir / "sshd_config"), "-E", str(self.dir / "sshd.log")]
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not start: {(self.dir / 'sshd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def new_host_key(self) -> None:
        """Restart with a fresh host key (the known_hosts file still has the old one)."""
        self.stop()
        keygen(self.dir / "host_ed25519")
        self.start()

    def connection_pids(self) -> list[int]:
        """The sshd processes serving connections (descendants of the listener that are sshd)."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        out, todo = [], list(children.get(self.proc.pid, []))
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                if os.readlink(f"/proc/{pid}/exe") == str(SSHD):
                    out.append(pid)
            except OSError:
                pass
        return out

    def kill_connections(self) -> int:
        """SIGKILL every per-connection sshd process: the client sees the connection drop."""
        pids = self.connection_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)


def start_sshd(folder: Path) -> Sshd:
    if not SSHD.exists() or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH sshd is not installed (scripts/setup.sh installs openssh-server)")
    folder.mkdir(parents=True, exist_ok=True)
    keygen(folder / "host_ed25519")
    client = keygen(folder / "client_ed25519")
    (folder / "authorized_keys").write_text(Path(f"{client}.pub").read_text())
    import getpass

    s = Sshd(folder, free_port(), getpass.getuser(), client, folder / "known_hosts")
    s.known_hosts.write_text(f"[127.0.0.1]:{s.port} {' '.join(s.host_pub)}\n")
    s.start()
    return s


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    s = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield s
    s.stop()


@pytest.fixture
def remote_tmp(tmp_path_factory):
    """The remote temp root; after the test, no agent folder may be left in it."""
    d = tmp_path_factory.mktemp("remote-tmp")
    yield d
    deadline = (
        time.monotonic() + 15
    )  # a dropped connection is cleaned up by the agent, shortly after
    while any(d.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sorted(p.name for p in d.iterdir())
    assert not left, f"remote temporary folders left behind: {left}"
