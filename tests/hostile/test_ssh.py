"""Hostile SSH: host keys, auth, unreachable hosts and remotes that break the protocol (issue 12).

Against a real OpenSSH sshd on 127.0.0.1 (``tests/sshd.py``). Every case: ``edgesplit profile
--remote`` exits 2 with one line naming the target and the problem, no traceback, nothing written
locally (no profile, no known_hosts entry unless opted in), no remote folder left behind (the
``remote_tmp`` fixture checks), and no hang (each case runs under a deadline).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import make_model, rand
from onnx import helper
from sshd import free_port, keygen, remote_tmp, sshd, start_sshd  # noqa: F401 - fixtures

from edgesplit.cli.main import main

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(90)]


def cli(*args) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def refused(result: tuple[int, str], *needles: str) -> str:
    """Exit 2, and the last stderr line (a progress bar may come first) is the one error."""
    code, err = result
    lines = err.strip().splitlines()
    errors = [ln for ln in lines if "error" in ln.lower()]
    assert code == 2, err
    assert errors == lines[-1:] and lines[-1].startswith("edgesplit: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[-1], (n, lines[-1])
    return lines[-1]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    import onnx

    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [("x", [1, 4])],
        [("y", [1, 4])],
        [("unused", rand(1))],
    )
    path = tmp_path_factory.mktemp("ssh-model") / "m.onnx"
    onnx.save(m, path)
    return path


def profile(
    model: Path,
    out: Path,
    s,
    remote_tmp: Path,  # noqa: F811
    *extra: str,
    flags=None,
) -> tuple[int, str]:
    """``edgesplit profile MODEL --remote`` to ``s``; ``flags`` replace the values of its ssh
    flags."""
    args = s.cli_args(remote_tmp, *extra)
    for flag, value in (flags or {}).items():
        args[args.index(flag) + 1] = value
    return cli(
        "profile", model, *args, "--backend", "ort", "--runs", "1", "--warmup", "0", "-q", "-o", out
    )


def fake_python(tmp_path: Path, body: str) -> str:
    """A "remote python" that is a shell script: it stands for an agent that misbehaves."""
    p = tmp_path / "python"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


def test_unknown_host_key_without_opt_in(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    kh = tmp_path / "ssh" / "known_hosts"
    r = profile(model, tmp_path / "p.json", sshd, remote_tmp, flags={"--known-hosts": str(kh)})
    refused(r, "unknown host key", sshd.target, "--accept-new-host-key")
    assert not kh.exists() and not (tmp_path / "p.json").exists()


def test_changed_host_key_is_refused_even_with_opt_in(remote_tmp, model, tmp_path):  # noqa: F811
    s = start_sshd(tmp_path / "sshd2")
    try:
        s.new_host_key()  # known_hosts still holds the old key: a man in the middle, or a rebuild
        before = s.known_hosts.read_text()
        for extra in ([], ["--accept-new-host-key"]):
            refused(
                profile(model, tmp_path / "p.json", s, remote_tmp, *extra),
                "host key has CHANGED",
                s.target,
            )
        assert s.known_hosts.read_text() == before and not (tmp_path / "p.json").exists()
    finally:
        s.stop()


def test_unreachable_port(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    port = free_port()  # nothing listens there
    args = sshd.cli_args(remote_tmp)
    args[args.index("--remote") + 1] = f"{sshd.user}@127.0.0.1:{port}"
    r = cli("profile", model, *args, "-q", "-o", tmp_path / "p.json")
    refused(r, f"127.0.0.1:{port}", "connection refused")


def test_wrong_user(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    args = sshd.cli_args(remote_tmp)
    args[args.index("--remote") + 1] = f"nobody-here@127.0.0.1:{sshd.port}"
    refused(cli("profile", model, *args, "-q", "-o", tmp_path / "p.json"), "authentication failed")
    assert not (tmp_path / "p.json").exists()


def test_wrong_key(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    wrong = keygen(tmp_path / "wrong_key")
    r = profile(model, tmp_path / "p.json", sshd, remote_tmp, flags={"--identity": str(wrong)})
    refused(r, "authentication failed", str(wrong))


def test_a_remote_that_closes_mid_protocol(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    """The agent writes half an event and exits."""
    python = fake_python(tmp_path, 'printf \'{"event": "rea\'\nexit 3\n')
    r = profile(model, tmp_path / "p.json", sshd, remote_tmp, flags={"--remote-python": python})
    refused(r, sshd.target, "the agent ended (exit 3) while starting the agent")
    assert not (tmp_path / "p.json").exists()


def test_a_remote_that_speaks_garbage(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    """Lines that are JSON but no event: a nesting bomb, a list, a number (a RecursionError or an
    AttributeError before); then the agent exits."""
    python = fake_python(
        tmp_path,
        "head -c 200000 /dev/zero | tr '\\0' '['; echo\n"
        "echo '[1, 2]'\necho 42\necho null\nexit 0\n",
    )
    r = profile(model, tmp_path / "p.json", sshd, remote_tmp, flags={"--remote-python": python})
    refused(r, sshd.target, "the agent ended (exit 0)")


def test_a_remote_that_sends_an_endless_line(sshd, remote_tmp, model, tmp_path, monkeypatch):  # noqa: F811
    """A line with no end: refused at the line limit, not buffered until memory runs out."""
    from edgesplit.profile import remote

    monkeypatch.setattr(remote, "MAX_LINE_NBYTES", 1 << 20)  # the real limit is 64 MiB
    python = fake_python(tmp_path, "head -c 3000000 /dev/zero | tr '\\0' 'x'\nsleep 60\n")
    r = profile(model, tmp_path / "p.json", sshd, remote_tmp, flags={"--remote-python": python})
    refused(r, sshd.target, "a line longer than 1,048,576 bytes")


def test_the_connection_dropped_mid_protocol(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    """The agent is started, then the connection is killed (sshd's connection process)."""
    python = fake_python(tmp_path, "cat > /dev/null\n")  # takes the agent in, says nothing

    def kill_once_started() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(remote_tmp.iterdir()):
            time.sleep(0.05)
        time.sleep(0.3)
        sshd.kill_connections()

    t = threading.Thread(target=kill_once_started, daemon=True)
    t.start()
    started = time.monotonic()
    r = profile(model, tmp_path / "p.json", sshd, remote_tmp, flags={"--remote-python": python})
    t.join()
    refused(r, sshd.target, "connection dropped while starting the agent")
    assert time.monotonic() - started < 60
    assert not (tmp_path / "p.json").exists()


def test_identity_file_that_is_not_a_key(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    bad = tmp_path / "not_a_key"
    bad.write_bytes(os.urandom(64))
    r = profile(model, tmp_path / "p.json", sshd, remote_tmp, flags={"--identity": str(bad)})
    refused(r, str(bad))


def test_known_hosts_that_is_a_directory(sshd, remote_tmp, model, tmp_path):  # noqa: F811
    (tmp_path / "kh").mkdir()
    r = profile(
        model, tmp_path / "p.json", sshd, remote_tmp, flags={"--known-hosts": str(tmp_path / "kh")}
    )
    refused(r, str(tmp_path / "kh"))


def test_a_fleet_file_with_an_alias_bomb(model, tmp_path):
    """A fleet file is YAML too: nested aliases are refused before they expand (no host is
    reached)."""
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdef", "bcdefg"):
        lines.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("\n".join(lines) + "\nhosts: *g\n")
    r = cli("profile", model, "--hosts", fleet, "-o", tmp_path / "out")
    refused(r, str(fleet), "anchors and aliases")
    assert not (tmp_path / "out").exists()
