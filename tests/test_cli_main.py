"""The ``edgesplit`` group itself: --version, --debug in either place, exit codes of remote errors."""

from __future__ import annotations

import tomllib

import pytest
from conftest import REPO, run_cli
from sshd import free_port

from edgesplit.cli.main import take_debug_flag
from edgesplit.errors import EdgesplitError, InputError, RemoteError, RemoteHostError


def test_version_is_pyproject_s():
    import edgesplit

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert edgesplit.__version__ == version
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"edgesplit {version}", r.stderr


def test_devices_lists_the_shipped_specs():
    r = run_cli("devices")
    assert r.returncode == 0, r.stderr
    assert "snapdragon-8gen2" in r.stdout and "links" in r.stdout


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_subcommand(where, tmp_path):
    args = (
        ["--debug", "partition", "no-such.onnx"]
        if where == "before"
        else ["partition", "no-such.onnx", "--debug"]
    )
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" in r.stderr and "ModelLoadError" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "edgesplit: error: no-such.onnx: no such file"


def test_without_debug_one_line_and_no_traceback(tmp_path):
    r = run_cli("partition", "no-such.onnx", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "edgesplit: error: no-such.onnx: no such file"


def test_debug_after_a_double_dash_is_an_argument():
    assert take_debug_flag(["run", "b", "--debug"]) == (["run", "b"], True)
    assert take_debug_flag(["run", "--", "--debug"]) == (["run", "--", "--debug"], False)
    assert take_debug_flag(["zoo"]) == (["zoo"], False)


def test_remote_error_exit_codes():
    """A host the user named that cannot be used is bad input (2); a run cut short is a failure (1)."""
    assert RemoteError("x").exit_code == 1 and not isinstance(RemoteError("x"), InputError)
    e = RemoteHostError("x")
    assert e.exit_code == 2 and isinstance(e, InputError) and isinstance(e, RemoteError)
    assert isinstance(e, EdgesplitError)


def test_a_refused_ssh_connection_exits_2(tmp_path):
    from edgesplit.model import zoo

    model = zoo.save("tiny_dag", tmp_path / "tiny.onnx")
    target = f"root@127.0.0.1:{free_port()}"
    r = run_cli(
        "profile", str(model), "--remote", target, "--known-hosts", str(tmp_path / "kh"), "-o", str(tmp_path / "p.json")
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert (
        r.stderr.strip() == f"edgesplit: error: {target}: connection refused on port {target.rsplit(':')[1]}"
    )
