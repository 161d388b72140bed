"""Hostile values for ``edgesplit run --generate``: ids outside the vocabulary or not integers,
negative counts, a cache past the model's limit, a bundle whose model is not a decoder or that has
several parts. Each exits 2 with one line, never a traceback."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest
from conftest import make_model, run_cli
from decoder_bundles import decoder_bundle
from onnx import helper

from edgesplit.model.load import load_model
from edgesplit.workflows.compile import compile_bundle

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return decoder_bundle(tmp_path_factory.mktemp("tiny"), "decoder_tiny")


@pytest.fixture(scope="module")
def relu(tmp_path_factory):
    from edgesplit.compile.manual import contiguous_plan

    root = tmp_path_factory.mktemp("relu")
    onnx.save(
        make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 4])], [("y", [1, 4])]
        ),
        root / "relu.onnx",
    )
    graph = load_model(root / "relu.onnx")
    compile_bundle(graph, contiguous_plan(graph, "host-biglittle", [("big", "ort")]), root / "b")
    return root / "b"


def _refused(r, *words: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--prompt-ids", "1,2,256"], ["in [0, 256)"]),
        (["--prompt-ids", "1,-3"], ["in [0, 256)"]),
        (["--prompt-ids", "1,x"], ["--prompt-ids", "not comma-separated integers"]),
        (["--prompt-tokens", "-4"], ["--prompt-tokens"]),
        (["--new-tokens", "-1"], ["--new-tokens"]),
        (["--chunk-tokens", "-1"], ["--chunk-tokens"]),
        (["--prompt-tokens", "500", "--new-tokens", "40"], ["past the limit of 512"]),
        (["--prompt-ids", "1", "--prompt-tokens", "3"], ["not both"]),
    ],
)
def test_bad_generate_flags(tiny, flags, words):
    _refused(run_cli("run", str(tiny), "--generate", *flags), *words)


def test_not_a_decoder(relu):
    _refused(run_cli("run", str(relu), "--generate"), "not a decoder", str(relu))


@pytest.mark.slow
def test_several_parts(tmp_path):
    b = decoder_bundle(tmp_path, "decoder_tiny", parts=2)
    _refused(run_cli("run", str(b), "--generate"), "one-part bundle", "this one has 2 parts")


def _edit_axes(bundle, name: str, axes: list[int]) -> None:
    """Set tensor ``name``'s dynamic axes in the manifest, in the part and the bundle's inputs
    alike (so that only the check against the ONNX file can tell)."""
    path = bundle / "manifest.json"
    m = json.loads(path.read_text())
    for t in (*m["inputs"], *m["parts"][0]["inputs"]):
        if t["name"] == name:
            t["dynamic_axes"] = axes
    path.write_text(json.dumps(m))


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [True, False])
def test_manifest_dynamic_axes_that_the_model_does_not_have(tmp_path, fixed):
    """A manifest that says an axis is dynamic where the part's ONNX fixes it, or fixed where the
    ONNX leaves it symbolic, is refused at load in one line."""
    b = decoder_bundle(tmp_path, "decoder_tiny", fixed=fixed)
    _edit_axes(b, "input_ids", [1] if fixed else [])
    r = run_cli("run", str(b), "--generate")
    _refused(r, "the manifest says input 'input_ids' of part p0 is int64")
    assert ("[1, '?']" if fixed else "[1, 1]") in r.stderr, r.stderr


@pytest.mark.parametrize("axes", [[5], [1, 1], [-1]])
def test_manifest_dynamic_axes_out_of_the_shape(tiny, tmp_path, axes):
    b = tmp_path / "b"
    shutil.copytree(tiny, b)
    _edit_axes(b, "input_ids", axes)
    _refused(run_cli("run", str(b), "--generate"), "dynamic_axes", "input_ids")
