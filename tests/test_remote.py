"""Remote profiling over a real OpenSSH sshd on 127.0.0.1: format, host keys, auth, quoting,
cleanup."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli
from sshd import keygen, remote_tmp, sshd, start_sshd  # noqa: F401 - fixtures

from edgesplit.device.spec import load_device
from edgesplit.errors import RemoteError
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.remote import RemoteOptions, detect_remote, profile_remote
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.ssh import SshOptions, parse_target
from edgesplit.profile.store import load_profile

BARE_PYTHON = Path("/usr/bin/python3")  # Debian's: Python 3.11 without numpy or onnxruntime


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return zoo.save("tiny_dag", tmp_path_factory.mktemp("models") / "tiny_dag.onnx")


def options(s, tmp: Path, **kw) -> SshOptions:
    base = dict(
        identity=str(s.identity),
        known_hosts=str(s.known_hosts),
        remote_python=sys.executable,
        remote_tmpdir=str(tmp),
        connect_timeout_s=10,
        step_timeout_s=60,
    )
    return SshOptions(**{**base, **kw})


def one_line_error(r) -> str:
    """The one error line, last on stderr (a progress bar may come before it); no traceback."""
    lines = r.stderr.strip().splitlines()
    errors = [ln for ln in lines if "error" in ln.lower()]
    assert errors == lines[-1:] and lines[-1].startswith("edgesplit: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[-1]


def test_parse_target():
    t = parse_target("pi@10.0.0.5:2222")
    assert (t.user, t.host, t.port, t.known_hosts_name) == (
        "pi",
        "10.0.0.5",
        2222,
        "[10.0.0.5]:2222",
    )
    v6 = parse_target("u@[::1]:22")
    assert (v6.host, v6.port, str(v6)) == ("::1", 22, "u@[::1]")
    assert parse_target("host").port == 22
    for bad in ("a@b@c", "h:99999", "", "h:x"):
        with pytest.raises(Exception, match="user@host"):
            parse_target(bad)


@pytest.mark.ssh
def test_remote_profile_has_the_local_shape(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    out = tmp_path / "remote.json"
    seen: list[tuple[str, int, int]] = []
    modes: list[int] = []

    def on_event(ev) -> None:
        if ev["event"] == "ready":  # the agent's folder, while it exists: private, under remote_tmp
            assert Path(ev["workdir"]).parent == remote_tmp
            modes.append(Path(ev["workdir"]).stat().st_mode & 0o777)

    prof = profile_remote(
        tiny,
        sshd.target,
        RemoteOptions(options(sshd, remote_tmp)),
        output=out,
        options=ProfileOptions(runs=3, warmup=1),
        progress=lambda label, done, total: seen.append((label, done, total)),
        on_event=on_event,
    )
    assert modes == [0o700]
    graph = load_model(tiny)
    local = profile_model(graph, load_device("host"), ProfileOptions(runs=3, warmup=1))
    assert load_profile(out) == prof
    assert [e.key for e in prof.entries] == [e.key for e in local.entries] == ["cpu/ort", "cpu/tvm"]
    for r, loc in zip(prof.entries, local.entries):
        assert set(r.nodes) == set(loc.nodes) == {n.name for n in graph.nodes}
        assert r.source == loc.source == "measured" and r.whole_model_ms > 0
    assert (prof.model_sha256, prof.model_name, prof.input_shapes) == (
        graph.sha256,
        graph.name,
        local.input_shapes,
    )
    assert json.loads(out.read_text()).keys() == local.to_json().keys()
    assert prof.energy == "modelled"  # no power rails on this machine
    labels = {label for label, _, _ in seen}
    assert {"upload", "cpu/ort", "cpu/tvm"} <= labels
    # each backend's progress reaches its end (TVM's counts fused kernels, fewer than the nodes)
    for key in ("cpu/ort", "cpu/tvm"):
        steps = [(done, total) for label, done, total in seen if label == key]
        assert 0 < steps[-1][0] == steps[-1][1] <= len(graph.nodes), (key, steps)
    assert not Path(f"{out}.partial").exists()


@pytest.mark.ssh
def test_cli_shell_metacharacters_in_the_model_path(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    work = tmp_path / "w; $(touch pwned-dir)"
    work.mkdir()
    model = work / "my model; $(touch pwned) 'x'.onnx"
    shutil.copy(tiny, model)
    out = work / "out $(touch pwned-out).json"
    r = run_cli(
        "profile",
        str(model),
        *sshd.cli_args(remote_tmp),
        "--backend",
        "ort",
        "--runs",
        "2",
        "--warmup",
        "1",
        "-o",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    prof = load_profile(out)
    assert prof.model_name == "my model; $(touch pwned) 'x'" and set(prof.entry("cpu", "ort").nodes)
    for where in (tmp_path, work, Path.home(), remote_tmp, Path.cwd()):
        assert not list(where.glob("pwned*")), where


@pytest.mark.ssh
def test_unknown_host_key_needs_opt_in_and_is_then_recorded(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    kh = tmp_path / "ssh" / "known_hosts"  # does not exist yet
    args = [
        "profile",
        str(tiny),
        "--remote",
        sshd.target,
        "--identity",
        str(sshd.identity),
        "--known-hosts",
        str(kh),
        "--remote-python",
        sys.executable,
        "--remote-tmpdir",
        str(remote_tmp),
        "--backend",
        "ort",
        "--runs",
        "1",
        "--warmup",
        "0",
        "-q",
        "-o",
        str(tmp_path / "p.json"),
    ]
    r = run_cli(*args)
    assert r.returncode == 2
    line = one_line_error(r)
    assert "unknown host key" in line and sshd.target in line and "--accept-new-host-key" in line
    assert not kh.exists() and not (tmp_path / "p.json").exists()

    opts = options(sshd, remote_tmp, known_hosts=str(kh))
    with pytest.raises(RemoteError, match="unknown host key"):
        detect_remote(sshd.target, opts)
    detect_remote(sshd.target, dataclasses.replace(opts, accept_new_host_key=True))
    assert kh.read_text().split() == [f"[127.0.0.1]:{sshd.port}", *sshd.host_pub]
    assert detect_remote(sshd.target, opts)["python"]  # now known: no opt-in needed


@pytest.mark.ssh
def test_changed_host_key_is_always_refused(remote_tmp, tiny, tmp_path):  # noqa: F811
    s = start_sshd(tmp_path / "sshd2")
    try:
        s.new_host_key()  # known_hosts still has the old key
        for extra in ([], ["--accept-new-host-key"]):
            r = run_cli(
                "profile",
                str(tiny),
                *s.cli_args(remote_tmp, *extra),
                "-q",
                "-o",
                str(tmp_path / "p.json"),
            )
            assert r.returncode == 2
            line = one_line_error(r)
            assert "host key has CHANGED" in line and s.target in line and "ssh-keygen -R" in line
        assert len(s.known_hosts.read_text().splitlines()) == 1  # never rewritten
    finally:
        s.stop()


@pytest.mark.ssh
def test_wrong_user_key_is_a_one_line_error(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    wrong = keygen(tmp_path / "wrong_key")
    args = sshd.cli_args(remote_tmp)
    args[args.index("--identity") + 1] = str(wrong)
    r = run_cli("profile", str(tiny), *args, "-o", str(tmp_path / "p.json"))
    assert r.returncode == 2
    line = one_line_error(r)
    assert "authentication failed" in line and sshd.target in line and str(wrong) in line


@pytest.mark.ssh
@pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="ssh-agent is not installed")
def test_auth_through_the_ssh_agent(sshd, remote_tmp, tmp_path, monkeypatch):  # noqa: F811
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* to fall back on
        subprocess.run(["ssh-add", str(sshd.identity)], check=True, capture_output=True)
        opts = options(sshd, remote_tmp, identity=None)
        assert detect_remote(sshd.target, opts)["python"]
        monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "none"))
        with pytest.raises(RemoteError, match="authentication failed: no key to offer"):
            detect_remote(sshd.target, opts)
    finally:
        agent.terminate()
        agent.wait(timeout=10)


@pytest.mark.ssh
def test_encrypted_key_without_passphrase_is_a_clear_input_error(
    sshd,  # noqa: F811 - the fixture
    remote_tmp,  # noqa: F811
    tiny,
    tmp_path,
    monkeypatch,
):
    key = tmp_path / "locked"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "sesame", "-f", str(key)], check=True
    )
    args = sshd.cli_args(remote_tmp)
    args[args.index("--identity") + 1] = str(key)
    r = run_cli("profile", str(tiny), *args, "-q", "-o", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "the key is encrypted" in one_line_error(r)
    with open(sshd.dir / "authorized_keys", "a") as f:
        f.write(Path(f"{key}.pub").read_text())
    monkeypatch.setenv("EDGESPLIT_SSH_PASSPHRASE", "sesame")  # from the environment, never a flag
    assert detect_remote(sshd.target, options(sshd, remote_tmp, identity=str(key)))["python"]


@pytest.mark.ssh
def test_unreachable_port_and_missing_python_are_clear(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    from sshd import free_port

    opts = options(sshd, remote_tmp, connect_timeout_s=3)
    with pytest.raises(RemoteError, match=r"root@127.0.0.1:\d+: connection refused"):
        profile_remote(
            tiny,
            f"{sshd.user}@127.0.0.1:{free_port()}",
            RemoteOptions(opts),
            output=tmp_path / "x.json",
        )
    opts = options(sshd, remote_tmp, remote_python="/no/such/python3")
    with pytest.raises(RemoteError, match="remote Python '/no/such/python3' not found"):
        profile_remote(tiny, sshd.target, RemoteOptions(opts), output=tmp_path / "x.json")


@pytest.mark.ssh
def test_a_silent_agent_hits_the_step_timeout_and_is_cleaned_up(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    hang = tmp_path / "hang.sh"  # a "python" that never answers
    hang.write_text("#!/bin/sh\nexec sleep 120\n")
    hang.chmod(0o755)
    opts = options(sshd, remote_tmp, remote_python=str(hang), step_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(
        RemoteError,
        match=r"no word from the agent for 1.5 s while starting the agent \(step timeout\)",
    ):
        profile_remote(tiny, sshd.target, RemoteOptions(opts), output=tmp_path / "x.json")
    assert time.monotonic() - started < 20
    assert not list(remote_tmp.iterdir())  # removed by the client, not left to the 120 s sleep


@pytest.mark.ssh
@pytest.mark.skipif(
    not BARE_PYTHON.exists(), reason="no /usr/bin/python3 to stand for a bare device"
)
def test_missing_modules_say_what_to_install(sshd, remote_tmp, tiny, tmp_path):  # noqa: F811
    args = sshd.cli_args(remote_tmp)
    args[args.index("--remote-python") + 1] = str(BARE_PYTHON)
    r = run_cli("profile", str(tiny), *args, "-o", str(tmp_path / "p.json"))
    if r.returncode == 0:
        pytest.skip(f"{BARE_PYTHON} has numpy, onnx, onnxruntime and onnxslim")
    line = one_line_error(r)
    assert "lacks" in line and f"{BARE_PYTHON} -m pip install" in line and "onnxruntime==" in line


def test_agent_zip_is_deterministic_and_self_contained():
    import io
    import zipfile

    from edgesplit.profile.agentzip import build_agent, remote_command

    data = build_agent()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert (
        "__main__.py" in names
        and "edgesplit/profile/agent.py" in names
        and "_vendor/yaml/__init__.py" in names
    )
    assert not any(n.startswith("edgesplit/cli/") for n in names)
    build_agent.cache_clear()
    assert build_agent() == data
    cmd = remote_command("/opt/my python/bin/python3", "/tmp/a b", {"X": "$(reboot)"})
    assert (
        "'/opt/my python/bin/python3'" in cmd
        and "TMPDIR='/tmp/a b'" in cmd
        and "X='$(reboot)'" in cmd
    )
