"""The shape of the command line: thin commands over one call, options declared once.

Checked on the source with :mod:`ast` (no command is run): every click command function in
``edgesplit/cli`` and every public function there is at most 60 lines and takes at most 8
parameters; and the options shared by several commands are on every command that should have them.
"""

from __future__ import annotations

import ast
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
