"""Hostile values for the flags issue 37 added or widened: ``--input NAME=FILE`` on the model
commands (profile, partition, deploy, compile) and on ``calibrate``, and the stage time limits.

Each is refused before anything runs, with exit code 2 and one line naming the flag or the file,
never a traceback; and nothing waits on a FIFO.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, run_cli
from onnx import helper

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("flags") / "relu.onnx"
    onnx.save(
        make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 4])], [("y", [1, 4])]
        ),
        p,
    )
    return p


def _files(tmp: Path) -> dict[str, str]:
    np.save(tmp / "good.npy", np.zeros((1, 4), np.float32))
    np.save(tmp / "pickle.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp / "text.npy").write_text("not an array")
    fifo = tmp / "fifo.npy"
    if not fifo.exists():
        os.mkfifo(fifo)
    (tmp / "dir").mkdir(exist_ok=True)
    return {
        k: str(tmp / v)
        for k, v in {
            "good": "good.npy",
            "pickle": "pickle.npy",
            "text": "text.npy",
            "fifo": "fifo.npy",
            "dir": "dir",
        }.items()
    }


# --input value -> what the one line must hold
INPUTS = {
    "a directory": ("x={dir}", "{dir}: is a directory, not a .npy file"),
    "a FIFO (must not hang)": ("x={fifo}", "{fifo}: not a regular file"),
    "a pickle": ("x={pickle}", "{pickle}: cannot read a .npy array"),
    "not a .npy file": ("x={text}", "{text}: cannot read a .npy array"),
    "a missing file": ("x={dir}/none.npy", "{dir}/none.npy: cannot read the input"),
    "no equals sign": ("x", "--input: 'x' is not NAME=FILE.npy"),
    "an unknown input": ("nope={good}", "--input names 'nope', not an input (inputs: x)"),
}


def _refused(r, needle: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], (needle, lines[0])


QUICK = (
    "a directory",
    "a FIFO (must not hang)",
)  # the quick subset's share; the suite runs them all
CASES = [
    pytest.param("profile", c, marks=[] if c in QUICK else [pytest.mark.slow]) for c in INPUTS
] + [
    pytest.param("partition", "a directory", marks=pytest.mark.slow),
    pytest.param("deploy", "a FIFO (must not hang)", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("command", "case"), CASES)
def test_a_hostile_model_input_is_one_line(model, tmp_path, command, case):
    files = _files(tmp_path)
    value, needle = (t.format(**files) for t in INPUTS[case])
    out = tmp_path / ("bundle" if command == "deploy" else "out.json")
    r = run_cli(command, str(model), "-d", "raspberry-pi5", "-o", str(out), "--input", value)
    _refused(r, needle)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["a directory", "a FIFO (must not hang)", "no equals sign"])
def test_a_hostile_calibrate_input_is_one_line(tmp_path, case):
    files = _files(tmp_path)
    value, needle = (t.format(**files) for t in INPUTS[case])
    (tmp_path / "bundle").mkdir()
    r = run_cli(
        "calibrate", str(tmp_path / "bundle"), "-o", str(tmp_path / "p.json"), "--input", value
    )
    _refused(r, needle)


LIMITS = [("profile", "0")] + [
    pytest.param(stage, v, marks=pytest.mark.slow)
    for stage, v in [
        ("load", "0"),
        ("simplify", "nan"),
        ("compile", "inf"),
        ("profile", "-1"),
        ("profile", "soon"),
    ]
]


@pytest.mark.parametrize(("stage", "value"), LIMITS)
def test_a_hostile_stage_limit_is_a_usage_error(model, tmp_path, stage, value):
    r = run_cli(
        "profile",
        str(model),
        "-d",
        "raspberry-pi5",
        "-o",
        str(tmp_path / "p.json"),
        f"--{stage}-timeout-s",
        value,
    )
    _refused(r, f"--{stage}-timeout-s")
