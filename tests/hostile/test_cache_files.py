"""Files in edgesplit's cache folder (``EDGESPLIT_CACHE``) are input too: a kept simplified model
or TVM library that is garbage, half there, of the wrong type, or a cache that cannot be written
never stops a load or a build or changes what it gives; the bad file is made again and replaced."""

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
    return (
        path,
        graph,
        onnx_file,
        onnx_file.read_bytes(),
        onnx_file.with_suffix(".json").read_text(),
    )


SPOILED = {
    "onnx garbage": (b"\x00garbage", None),
    "onnx empty": (b"", None),
    "onnx truncated": ("half", None),
    "json garbage": (None, "{"),
    "json not a list": (None, '{"notes": []}'),
    "json list of numbers": (None, "[1, 2]"),
    "json missing": (None, "missing"),
    "notes of the wrong type, the sha256 right": (None, "numbers"),
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
    mine.write_bytes(
        {"half": half, None: good_onnx, "missing": good_onnx}.get(spoil_onnx, spoil_onnx)
    )
    wrong = json.dumps({**json.loads(good_json), "notes": [1, 2]})
    notes.write_text(
        {None: good_json, "missing": good_json, "numbers": wrong}.get(spoil_json, spoil_json)
    )
    for f, spoil in ((mine, spoil_onnx), (notes, spoil_json)):
        if spoil == "missing":
            f.unlink()
    again = load_model(path)
    assert again == graph and again.model.SerializeToString() == graph.model.SerializeToString()
    assert mine.read_bytes() == good_onnx and json.loads(notes.read_text()) == json.loads(good_json)


def test_a_cache_that_cannot_be_written_keeps_nothing_and_the_load_goes_on(
    kept, tmp_path, monkeypatch
):
    path, graph, onnx_file, *_ = kept
    (tmp_path / "cache").write_text("a file where the cache folder goes")
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    assert load_model(path) == graph
    (tmp_path / "cache").unlink()
    (tmp_path / "cache" / "simplified" / onnx_file.name).mkdir(
        parents=True
    )  # a folder where it goes
    assert load_model(path) == graph
    assert (tmp_path / "cache" / "simplified" / onnx_file.name).is_dir()


@pytest.mark.slow
def test_a_spoiled_kept_tvm_library_is_built_again_and_replaced(tmp_path, monkeypatch):
    """A one-node model (a fraction of a second to build): its kept library (empty, cut in half:
    its sha256 no longer matches) and facts spoiled in turn; each build gives the first build's
    facts, and mends the kept pair."""
    from conftest import make_model
    from onnx import helper

    from edgesplit.backends.tvm.build import build_library
    from edgesplit.device.host import llvm_target

    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 8])], [("y", [1, 8])]
    )
    first = build_library(model, llvm_target(), tmp_path / "a.so", threads=1)
    (lib,) = (tmp_path / "cache" / "tvm-libs").glob("*.so")
    facts, good_lib, good_facts = (
        lib.with_suffix(".json"),
        lib.read_bytes(),
        lib.with_suffix(".json").read_text(),
    )
    no_info = json.dumps({k: v for k, v in json.loads(good_facts).items() if k != "info"})
    spoiled = [
        (b"", None),
        (good_lib[: len(good_lib) // 2], None),
        (None, "{"),
        (None, "[1, 2]"),
        (None, ""),
    ]
    for i, (spoil_lib, spoil_facts) in enumerate([*spoiled, (None, no_info)]):
        lib.write_bytes(good_lib if spoil_lib is None else spoil_lib)
        facts.write_text(good_facts if spoil_facts is None else spoil_facts)
        out = tmp_path / f"b{i}.so"
        info = build_library(model, llvm_target(), out, threads=1)
        assert "kept" not in info and info == first, i
        assert (
            out.stat().st_size > 0
            and lib.read_bytes() == good_lib
            and facts.read_text() == good_facts
        )
    facts.unlink()
    assert "kept" not in build_library(model, llvm_target(), tmp_path / "c.so", threads=1)


@pytest.mark.slow
def test_a_spoiled_kernel_library_kept_by_the_profiler_is_built_again_and_replaced(
    tmp_path, monkeypatch
):
    """The profiler loads the libraries it kept (:func:`edgesplit.backends.tvm.profile.build_vm`):
    one cut
    in half, emptied, or no library at all under a matching sha256, is compiled again, runs, and
    is replaced by a good one."""
    import numpy as np
    from conftest import make_model
    from onnx import helper

    from edgesplit.backends.tvm.profile import build_vm, tvm_tensor
    from edgesplit.cache import keep

    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 8])], [("y", [1, 8])]
    )
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    build_vm(model, {"kind": "llvm"})
    (lib,) = (tmp_path / "cache" / "tvm-libs").glob("*.so")
    good = lib.read_bytes()
    for spoiled in (good[: len(good) // 2], b""):
        lib.write_bytes(spoiled)
        vm, dev = build_vm(model, {"kind": "llvm"})
        assert np.array_equal(vm["main"](tvm_tensor(x, dev)).numpy(), np.maximum(x, 0))
        assert lib.read_bytes() == good
    # no library at all, kept whole with its own sha256 (by another program): it cannot be loaded
    info = json.loads(lib.with_suffix(".json").read_text())["info"]
    keep(lib, b"\x7fELF but not a library", {"info": info}, 10**9)
    vm, dev = build_vm(model, {"kind": "llvm"})
    assert np.array_equal(vm["main"](tvm_tensor(x, dev)).numpy(), np.maximum(x, 0))
    assert lib.read_bytes() == good


# ---- edgesplit cache: its arguments and what it finds in the folder


def _cache_cli(capsys, *args: str) -> tuple[int, str, str]:
    from edgesplit.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["cache", *args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize("kinds", [("nosuch",), ("simplified", "../etc"), ("",), ("ALL",)])
def test_cache_clear_of_an_unknown_kind_is_refused_before_anything_goes(
    kinds, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path))
    (tmp_path / "simplified").mkdir()
    (tmp_path / "simplified" / "m.onnx").write_bytes(b"x")
    args = [a for k in kinds for a in ("--clear", k)]
    code, out, err = _cache_cli(capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no cache kind" in err, err
    assert "kinds: simplified, tvm-libs" in err and "Traceback" not in err and not out
    assert (tmp_path / "simplified" / "m.onnx").read_bytes() == b"x"


def test_a_cache_that_is_a_file_is_named(tmp_path, monkeypatch, capsys):
    (tmp_path / "f").write_text("not a folder")
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "f"))
    for args in ((), ("--clear", "all")):
        code, out, err = _cache_cli(capsys, *args)
        assert (
            code == 2
            and err.strip() == f"edgesplit: error: EDGESPLIT_CACHE={tmp_path / 'f'}: not a folder"
        )
    assert (tmp_path / "f").read_text() == "not a folder"


def test_links_files_and_leftovers_in_the_cache(tmp_path, monkeypatch, capsys):
    """A link in a kind's folder is counted and deleted as a link (what it points to stays); a kind
    that is a file, not a folder, is counted and cleared; a folder left by a clear that crashed goes
    with the next clear."""
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"y" * 1000)
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGESPLIT_CACHE", str(cache))
    (cache / "tvm-libs").mkdir(parents=True)
    (cache / "tvm-libs" / "link").symlink_to(outside)
    (cache / "tvm-libs" / "file-link").symlink_to(outside / "data.bin")
    (cache / "calibration").write_bytes(b"z" * 10)
    (cache / ".clearing-accuracy-1").mkdir()
    (cache / ".clearing-accuracy-1" / "a.json").write_text("{}")
    (cache / ".clearing-tvm-libs-2").symlink_to(outside)  # a crashed clear of a linked kind
    code, out, err = _cache_cli(capsys)
    assert code == 0 and "never cleared here" not in out, out  # leftovers are edgesplit's own
    code, out, err = _cache_cli(capsys, "--json")
    rows = {r["kind"]: r for r in json.loads(out)}
    assert (
        code == 0
        and rows["tvm-libs"]["n_files"] == 2
        and rows["calibration"]
        == {
            **rows["calibration"],
            "n_files": 1,
            "nbytes": 10,
        }
    )
    code, _, err = _cache_cli(capsys, "--clear", "all")
    assert code == 0, err
    assert sorted(p.name for p in cache.iterdir()) == []
    assert (outside / "data.bin").read_bytes() == b"y" * 1000


def test_a_kind_moved_elsewhere_by_a_link_is_emptied_there_and_keeps_its_link(
    tmp_path, monkeypatch, capsys
):
    elsewhere = tmp_path / "big-disk" / "simplified"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "m.onnx").write_bytes(b"m" * 100)
    (elsewhere / "sub" / "x").write_bytes(b"x")
    (tmp_path / "precious").write_bytes(b"p")
    (elsewhere / "link-out").symlink_to(tmp_path / "precious")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "simplified").symlink_to(elsewhere)
    monkeypatch.setenv("EDGESPLIT_CACHE", str(cache))
    code, out, _ = _cache_cli(capsys, "--json")
    row = next(r for r in json.loads(out) if r["kind"] == "simplified")
    assert (
        code == 0
        and row["n_files"] == 3
        and row["nbytes"] == 101 + (elsewhere / "link-out").lstat().st_size
    )
    code, _, err = _cache_cli(capsys, "--clear", "simplified")
    assert code == 0, err
    assert (
        (cache / "simplified").is_symlink() and elsewhere.is_dir() and not any(elsewhere.iterdir())
    )
    assert (tmp_path / "precious").read_bytes() == b"p"
