"""The shape of the command line: thin commands over one call, options declared once.

Checked on the source with :mod:`ast` (no command is run): every click command function in
``edgesplit/cli`` and every public function there is at most 60 lines and takes at most 8
parameters; and the options shared by several commands are on every command that should have them.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

import click
import pytest

import edgesplit.cli

CLI = Path(edgesplit.cli.__file__).parent
MAX_LINES = 60
MAX_PARAMS = 8


def _functions() -> list[tuple[str, ast.FunctionDef]]:
    out = []
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((f"{path.name}:{node.name}", node))
    return out


def _is_command(node: ast.FunctionDef) -> bool:
    """Decorated as a click command or group (``@click.command``, ``@command.command`` ...)."""
    for d in node.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        if isinstance(f, ast.Attribute) and f.attr in ("command", "group"):
            return True
    return False


def _is_public(name: str, node: ast.FunctionDef) -> bool:
    return not node.name.startswith("_")


def _params(node: ast.FunctionDef) -> int:
    a = node.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    n += (a.vararg is not None) + (a.kwarg is not None)
    if a.args and a.args[0].arg in ("self", "cls"):
        n -= 1
    return n


FUNCTIONS = _functions()
COMMANDS = [(name, node) for name, node in FUNCTIONS if _is_command(node)]


def test_commands_found():
    names = {name.split(":")[0] for name, _ in COMMANDS}
    assert len(COMMANDS) >= 16, names
    assert {"partition.py", "deploy.py", "serve.py", "profile.py", "run.py"} <= names


@pytest.mark.parametrize(
    "name,node",
    [(n, f) for n, f in FUNCTIONS if _is_command(f) or _is_public(n, f)],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_function_is_short(name, node):
    lines = node.end_lineno - node.lineno + 1
    assert lines <= MAX_LINES, f"{name} is {lines} lines (at most {MAX_LINES})"


@pytest.mark.parametrize(
    "name,node",
    [(n, f) for n, f in FUNCTIONS if _is_command(f) or _is_public(n, f)],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_function_takes_few_parameters(name, node):
    assert _params(node) <= MAX_PARAMS, f"{name} takes {_params(node)} parameters"


def _leaf_commands() -> dict[str, click.Command]:
    from edgesplit.cli.main import SUBCOMMANDS, cli

    ctx = click.Context(cli)
    out = {}
    for name in SUBCOMMANDS:
        cmd = cli.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            out.update({f"{name} {n}": c for n, c in cmd.commands.items()})
        else:
            out[name] = cmd
    return out


def _flags(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params for o in p.opts}


LEAVES = _leaf_commands()

# option -> the commands that must have it (declared once in edgesplit/cli/options.py or common.py)
SHARED = {
    "-q": set(LEAVES),
    "--debug": set(LEAVES),
    "--input-shape": {"profile", "partition", "deploy", "compile", "tune"},
    "--input": {"profile", "partition", "deploy", "compile"},
    "--server-load": {"partition", "deploy"},
    "--server-slots": {"partition", "deploy"},
    "--min-snr-db": {"partition", "deploy"},
    "--calibration-method": {"partition", "deploy"},
    "--split-operators": {"partition", "deploy"},
    "--max-batch": {"serve", "export-triton"},
    "--max-queue-delay-ms": {"serve", "export-triton"},
    "--force": {"deploy", "compile", "keygen"},
    "--tune-trials-per-task": {"deploy", "compile"},
    "--remote": {"profile", "tune", "devices detect"},
    "--known-hosts": {"profile", "tune", "devices detect"},
    "--load-timeout-s": {"profile", "partition", "deploy", "compile"},
}


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_shared_option_on_every_command(flag):
    missing = sorted(name for name in SHARED[flag] if flag not in _flags(LEAVES[name]))
    assert not missing, f"{flag} missing on {missing}"


def test_partition_and_deploy_take_the_same_plan_options():
    """The options a plan is made from are one group: partition and deploy cannot drift apart."""
    from edgesplit.cli.options import PlanOptions

    def options(group) -> set[str]:  # a group's own options and those of the groups it holds
        fields = dataclasses.fields(group)
        inner = [type(f.default) for f in fields if dataclasses.is_dataclass(f.default)]
        own = {f.name for f in fields if not dataclasses.is_dataclass(f.default)}
        return own.union(*map(options, inner))

    fields = options(PlanOptions)
    assert {"server", "rtt_ms", "pins", "min_snr_db", "calibration_method"} <= fields
    for name in ("partition", "deploy"):
        params = {p.name for p in LEAVES[name].params}
        assert fields <= params, f"{name} lacks {sorted(fields - params)}"


def test_choices_built_in_one_place():
    """``Choices(...)`` is called once in edgesplit/cli (PlanOptions.choices)."""
    calls = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Choices":
                calls.append(f"{path.name}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("options.py"), calls


def _main(capsys, *args: str) -> tuple[int, str, str]:
    from edgesplit.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_deploy_checks_server_load_as_partition_does(capsys, tmp_path):
    """``--server-load`` reaches deploy's choices: without a server it is refused before the model
    is read (the model here does not exist), as partition refuses it."""
    for cmd in (["partition"], ["deploy", "-o", str(tmp_path / "b")]):
        code, _, err = _main(capsys, *cmd, str(tmp_path / "none.onnx"), "--server-load", "2", "-q")
        assert code == 2 and "--server-load needs --server" in err, err


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_and_debug_on_a_command(capsys, tmp_path, where, monkeypatch):
    """``-q`` and ``--debug`` parse on a command, and --debug works before or after it."""
    monkeypatch.setenv("EDGESPLIT_DEBUG", "0")  # recorded, so the "1" --debug sets is undone
    key = str(tmp_path / "k")
    args = (
        ["--debug", "keygen", key, "-q"] if where == "before" else ["keygen", key, "-q", "--debug"]
    )
    code, out, _ = _main(capsys, *args)
    assert code == 0 and "wrote" in out
    assert os.environ["EDGESPLIT_DEBUG"] == "1"
