"""README's examples run as tests: the Python API block, and the public API is what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import edgesplit

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.slow
def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks()
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "(1, 10)" in out
    assert (tmp_path / "tiny-bundle" / "manifest.json").exists()


def test_public_api_is_complete():
    for name in edgesplit.__all__:
        assert hasattr(edgesplit, name), name
    for name in (
        "load_model",
        "profile_model",
        "partition",
        "compile_bundle",
        "deploy",
        "load",
        "Session",
    ):
        assert name in edgesplit.__all__, name


def test_readme_commands_exist():
    from edgesplit.cli.main import SUBCOMMANDS

    text = README.read_text()
    for cmd in re.findall(r"^\$E (\S+)", text, flags=re.M):
        assert cmd in SUBCOMMANDS, cmd


def test_readme_command_table_names_every_subcommand():
    from edgesplit.cli.main import SUBCOMMANDS

    table = set(re.findall(r"^\| `([\w-]+)` \|", README.read_text(), flags=re.M))
    assert set(SUBCOMMANDS) <= table, sorted(set(SUBCOMMANDS) - table)


def test_readme_is_a_front_door():
    """At most 250 lines: the rest lives in docs/ (STYLE.md, "Docs are a product")."""
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move the detail to docs/"


def test_readme_links_resolve():
    root = README.parent
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" not in target:
            assert (root / target).is_file(), target
