"""Profiling a fleet: hosts in parallel, one failing host does not stop the others."""

from __future__ import annotations

import sys

import pytest
from conftest import run_cli
from sshd import free_port, remote_tmp, sshd  # noqa: F401 - fixtures

from edgesplit.errors import InputError
from edgesplit.model import zoo
from edgesplit.profile.fleet import load_fleet
from edgesplit.profile.ssh import SshOptions
from edgesplit.profile.store import load_profile


@pytest.mark.ssh
def test_fleet_profiles_every_reachable_host_and_reports_the_rest(sshd, remote_tmp, tmp_path):  # noqa: F811
    model = zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "jobs: 2\n"
        "defaults:\n"
        f"  identity: {sshd.identity}\n"
        f"  known_hosts: {sshd.known_hosts}\n"
        f"  remote_python: {sys.executable}\n"
        f"  remote_tmpdir: {remote_tmp}\n"
        "  connect_timeout_s: 5\n"
        "hosts:\n"
        f"  - {{name: board-a, remote: '{sshd.target}'}}\n"
        f"  - {{name: board-b, remote: '{sshd.target}'}}\n"
        f"  - {{name: down, remote: '{sshd.user}@127.0.0.1:{free_port()}'}}\n"
    )
    out = tmp_path / "profiles"
    r = run_cli(
        "profile",
        str(model),
        "--hosts",
        str(fleet),
        "-o",
        str(out),
        "--backend",
        "ort",
        "--runs",
        "2",
        "--warmup",
        "1",
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "edgesplit: error: 1 of 3 hosts failed: down"
    rows = {
        line.split("│")[1].strip(): line for line in r.stdout.splitlines() if line.count("│") > 5
    }
    assert "ok" in rows["board-a"] and "ok" in rows["board-b"] and "FAILED" in rows["down"]
    assert "connection refused" in r.stdout
    for name in ("board-a", "board-b"):
        prof = load_profile(out / f"{name}.profile.json")
        assert [e.key for e in prof.entries] == ["cpu/ort"] and prof.model_name == "tiny_dag"
    assert not (out / "down.profile.json").exists()
    for name in ("board-a", "board-b", "down"):  # one progress row per host
        assert name in r.stderr


def test_fleet_file_errors_name_the_file_and_every_key(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("hosts:\n  - {name: a}\n  - {name: 'b c', remote: x, colour: red}\n")
    with pytest.raises(InputError) as e:
        load_fleet(f)
    msg = str(e.value)
    assert str(f) in msg and "hosts.0: 'remote' is a required property" in msg
    assert "hosts.1" in msg and "colour" in msg and "'b c'" in msg
    f.write_text("hosts:\n  - {name: a, remote: x}\n  - {name: a, remote: y}\n")
    with pytest.raises(InputError, match="duplicate names a"):
        load_fleet(f)


def test_fleet_options_override_the_command_line(tmp_path):
    f = tmp_path / "f.yaml"
    f.write_text(
        "defaults: {remote_python: /opt/py, step_timeout_s: 9}\n"
        "hosts:\n  - {name: a, remote: 'u@h:2200'}\n  - {name: b, remote: h2, remote_python: py3}\n"
    )
    fleet = load_fleet(f, SshOptions(identity="/k", remote_python="python3"))
    a, b = fleet.hosts
    assert (str(a.target), a.opts.remote_python, a.opts.identity, a.opts.step_timeout_s) == (
        "u@h:2200",
        "/opt/py",
        "/k",
        9,
    )
    assert b.opts.remote_python == "py3" and fleet.jobs == 4
