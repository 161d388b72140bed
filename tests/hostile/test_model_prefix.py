"""Hostile server model prefixes (``serve --model-prefix``, ``run --server-model-prefix``): a prefix
becomes part of a model's name in URL paths and in a Triton repository's folders, so anything but
letters, digits, ``_``, ``.`` and ``-`` (a slash, a space, ``..``-style paths, non-ASCII, a CR/LF
that would split a request line) is refused before anything runs: exit 2, one line naming the flag.
"""

from __future__ import annotations

import click
import pytest
from conftest import run_cli

from edgesplit.cli.run import check_prefix
from edgesplit.errors import InputError
from edgesplit.serve.server import ServeOptions

BAD = {
    "a slash": "fleet/a",
    "a parent path": "../up",
    "a space": "a b",
    "a line break": "a\r\nHost: evil",
    "non-ASCII": "modèle",
    "too long": "m" * 129,
}


@pytest.mark.parametrize("prefix", [BAD["a slash"], BAD["a line break"]], ids=["slash", "CRLF"])
@pytest.mark.parametrize(
    ("command", "flag"), [("run", "--server-model-prefix"), ("serve", "--model-prefix")]
)
def test_a_bad_model_prefix_is_one_line_exit_2(tmp_path, command, flag, prefix):
    """Through the console script (a process each): the two flags, two of the cases; every case is
    refused by the same check below."""
    r = run_cli(command, flag, prefix, str(tmp_path))
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr
    assert len(lines) == 1 and flag in lines[0], r.stderr


@pytest.mark.parametrize("prefix", BAD.values(), ids=BAD.keys())
def test_serve_options_and_run_refuse_a_bad_prefix(prefix):
    with pytest.raises(InputError, match="--model-prefix"):
        ServeOptions(model_prefix=prefix).check()
    with pytest.raises(click.BadParameter) as info:
        check_prefix(prefix, "--server-model-prefix")
    assert "--server-model-prefix" in info.value.format_message()


def test_a_good_prefix_passes():
    ServeOptions(model_prefix="squeezenet_0f3a9c2e.v1-b").check()
