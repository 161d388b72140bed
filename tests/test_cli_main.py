"""The ``edgesplit`` group itself: --version, --debug in either place, exit codes of remote errors.

The console script runs once in a subprocess (``--version``); the rest call ``main`` in this
process, which is what the script calls, at a fraction of the cost of a new interpreter.
"""

from __future__ import annotations

import tomllib

import pytest
from conftest import REPO, run_cli
from sshd import free_port

from edgesplit.cli.main import main, take_debug_flag
from edgesplit.errors import EdgesplitError, InputError, RemoteError, RemoteHostError

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture
def cli(capsys, monkeypatch):
    """``edgesplit ARGS`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("EDGESPLIT_DEBUG", "")  # --debug sets it; the fixture restores it after

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as e:
            main(list(args))
        out = capsys.readouterr()
        return e.value.code, out.out, out.err

    return run


def test_version_is_pyproject_s():
    import edgesplit

    assert edgesplit.__version__ == VERSION and "__version__" in dir(edgesplit)
    r = run_cli("--version")  # the console script, as installed
    assert r.returncode == 0 and r.stdout.strip() == f"edgesplit {VERSION}", r.stderr


def test_devices_lists_the_shipped_specs(cli):
    code, out, _ = cli("devices")
    assert code == 0 and "snapdragon-8gen2" in out and "links" in out


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_subcommand(cli, where, tmp_path):
    args = (
        ["--debug", "partition", "no-such.onnx"]
        if where == "before"
        else ["partition", "no-such.onnx", "--debug"]
    )
    code, _, err = cli(*[str(tmp_path / a) if a.endswith(".onnx") else a for a in args])
    assert code == 2 and "Traceback" in err and "ModelLoadError" in err, err
    assert (
        err.strip().splitlines()[-1]
        == f"edgesplit: error: {tmp_path / 'no-such.onnx'}: no such file"
    )


def test_without_debug_one_line_and_no_traceback(cli, tmp_path):
    code, _, err = cli("partition", str(tmp_path / "no-such.onnx"))
    assert code == 2 and err == f"edgesplit: error: {tmp_path / 'no-such.onnx'}: no such file\n"


def test_debug_after_a_double_dash_is_an_argument():
    assert take_debug_flag(["run", "b", "--debug"]) == (["run", "b"], True)
    assert take_debug_flag(["run", "--", "--debug"]) == (["run", "--", "--debug"], False)
    assert take_debug_flag(["zoo"]) == (["zoo"], False)


def test_remote_error_exit_codes():
    """A host the user named that cannot be used is bad input (2); a run cut short is a failure
    (1)."""
    assert RemoteError("x").exit_code == 1 and not isinstance(RemoteError("x"), InputError)
    e = RemoteHostError("x")
    assert e.exit_code == 2 and isinstance(e, InputError) and isinstance(e, RemoteError)
    assert isinstance(e, EdgesplitError)


def test_a_refused_ssh_connection_exits_2(cli, tmp_path):
    from edgesplit.model import zoo

    model = zoo.save("tiny_dag", tmp_path / "tiny.onnx")
    port = free_port()
    target = f"root@127.0.0.1:{port}"
    code, _, err = cli(
        "profile",
        str(model),
        "--remote",
        target,
        "--known-hosts",
        str(tmp_path / "kh"),
        "-q",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert (
        code == 2
        and err.strip() == f"edgesplit: error: {target}: connection refused on port {port}"
    ), err


@pytest.mark.parametrize("command", ["profile", "partition", "deploy"])
def test_a_bad_device_spec_is_reported_before_the_model_is_read(cli, command, tmp_path):
    """Reading a model can take seconds (onnxslim alone imports sympy): a spec that cannot be used
    is reported first. The model here does not exist, so the old order named the model."""
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        "name: broken\nkind: device\nprocessors:\n  cpu: {kind: cpu, peak_gflops: -1}\n"
    )
    code, _, err = cli(
        command, str(tmp_path / "no-such.onnx"), "--device", str(spec), "-o", str(tmp_path / "o")
    )
    line = err.strip()
    assert code == 2 and len(line.splitlines()) == 1, err
    assert str(spec) in line and "processors.cpu" in line and "no-such.onnx" not in line, line


def test_refit_keeps_its_old_name_calibrate_unlisted():
    from click.testing import CliRunner

    from edgesplit.cli.main import cli as cli_main

    listed = CliRunner().invoke(cli_main, ["--help"]).output
    assert "refit" in listed and "calibrate" not in listed.split("Commands:")[1]
    old = CliRunner().invoke(cli_main, ["calibrate", "--help"])
    assert old.exit_code == 0 and "fit the cost terms of their profile" in old.output
