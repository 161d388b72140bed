"""Files in edgesplit's cache folder (``EDGESPLIT_CACHE``) are input too: a kept simplified model
that is garbage, half there, of the wrong type, or a cache that cannot be written never stops a
load or changes what it gives; the bad file is made again and replaced."""

from __future__ import annotations

import json
import os

import pytest

from edgesplit.model import zoo
from edgesplit.model.load import load_model


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """squeezenet loaded once into a private cache: the model, its graph, the kept pair of files."""
    root = tmp_path_factory.mktemp("kept")
    os.environ["EDGESPLIT_CACHE"] = str(root / "cache")
    try:
        path = zoo.save("squeezenet", root / "sq.onnx")
        graph = load_model(path)
    finally:
        del os.environ["EDGESPLIT_CACHE"]
    (onnx_file,) = (root / "cache" / "simplified").glob("*.onnx")
    return path, graph, onnx_file, onnx_file.read_bytes(), onnx_file.with_suffix(".json").read_text()


SPOILED = {
    "onnx garbage": (b"\x00garbage", None),
    "onnx empty": (b"", None),
    "onnx truncated": ("half", None),
    "json garbage": (None, "{"),
    "json not a list": (None, '{"notes": []}'),
    "json list of numbers": (None, "[1, 2]"),
    "json missing": (None, "missing"),
    "onnx missing": ("missing", None),
}


@pytest.mark.parametrize("case", list(SPOILED))
def test_a_spoiled_kept_model_is_folded_again_and_replaced(kept, case, tmp_path, monkeypatch):
    path, graph, onnx_file, good_onnx, good_json = kept
    cache = tmp_path / "cache" / "simplified"
    cache.mkdir(parents=True)
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    mine, notes = cache / onnx_file.name, cache / onnx_file.with_suffix(".json").name
    spoil_onnx, spoil_json = SPOILED[case]
    half = good_onnx[: len(good_onnx) // 2]
    mine.write_bytes({"half": half, None: good_onnx, "missing": good_onnx}.get(spoil_onnx, spoil_onnx))
    notes.write_text(spoil_json if spoil_json not in (None, "missing") else good_json)
    for f, spoil in ((mine, spoil_onnx), (notes, spoil_json)):
        if spoil == "missing":
            f.unlink()
    again = load_model(path)
    assert again == graph and again.model.SerializeToString() == graph.model.SerializeToString()
    assert mine.read_bytes() == good_onnx and json.loads(notes.read_text()) == json.loads(good_json)


def test_a_cache_that_cannot_be_written_keeps_nothing_and_the_load_goes_on(kept, tmp_path, monkeypatch):
    path, graph, onnx_file, *_ = kept
    (tmp_path / "cache").write_text("a file where the cache folder goes")
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    assert load_model(path) == graph
    (tmp_path / "cache").unlink()
    (tmp_path / "cache" / "simplified" / onnx_file.name).mkdir(parents=True)  # a folder where it goes
    assert load_model(path) == graph
    assert (tmp_path / "cache" / "simplified" / onnx_file.name).is_dir()
