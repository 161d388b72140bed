"""``edgesplit cache``: what is kept between runs, made by real loads and builds in a private
``EDGESPLIT_CACHE``, shown by kind and cleared by kind (:mod:`edgesplit.cache`)."""

from __future__ import annotations

import json

import pytest

from edgesplit.cache import KINDS, SAFE_TO_CLEAR
from edgesplit.cli.main import main
from edgesplit.model import zoo
from edgesplit.model.load import load_model


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def shown(capsys) -> dict[str, dict]:
    code, out, err = run(capsys, "cache", "--json")
    assert code == 0, err
    return {row["kind"]: row for row in json.loads(out)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("EDGESPLIT_CACHE", str(root))
    return root


@pytest.mark.slow
def test_kept_work_is_shown_by_kind_and_cleared_by_kind(cache, tmp_path, capsys):
    from conftest import make_model
    from onnx import helper

    from edgesplit.backends.tvm.build import build_library
    from edgesplit.device.host import llvm_target

    assert {k: r["n_files"] for k, r in shown(capsys).items()} == dict.fromkeys(
        KINDS, 0
    )  # nothing yet
    path = zoo.save("squeezenet", tmp_path / "sq.onnx")  # 66 nodes: its simplified model is kept
    graph = load_model(path)
    relu = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 8])], [("y", [1, 8])]
    )
    build_library(relu, llvm_target(), tmp_path / "r.so", threads=1)
    (cache / "tvm-tuning" / "llvm-x").mkdir(parents=True)
    (cache / "tvm-tuning" / "llvm-x" / "database_tuning_record.json").write_text("{}\n")
    (cache / "arm64-board").mkdir()  # another tool's folder beside ours
    rows = shown(capsys)
    kept_model = cache / "simplified"
    assert (
        rows["simplified"]["n_files"] == 2 and rows["tvm-libs"]["n_files"] == 2
    )  # each a kept pair
    assert rows["simplified"]["nbytes"] == sum(f.stat().st_size for f in kept_model.iterdir())
    assert rows["simplified"]["max_nbytes"] == 2 << 30 and rows["tvm-tuning"]["n_files"] == 1
    code, out, _ = run(capsys, "cache")
    assert (
        code == 0 and "simplified" in out and f"never cleared here): {cache / 'arm64-board'}" in out
    )

    code, out, err = run(capsys, "cache", "--clear", "simplified")
    assert code == 0 and "cleared from" in out, err
    after = shown(capsys)
    assert after["simplified"]["n_files"] == 0 and after["tvm-libs"]["n_files"] == 2
    assert (
        load_model(path) == graph and len(list(kept_model.iterdir())) == 2
    )  # made again, kept again

    code, _, err = run(capsys, "cache", "--clear", "all")
    assert code == 0, err
    after = shown(capsys)
    assert all(after[k]["n_files"] == 0 for k in SAFE_TO_CLEAR)
    assert after["tvm-tuning"]["n_files"] == 1 and (cache / "arm64-board").is_dir()  # named only
    code, _, err = run(capsys, "cache", "--clear", "tvm-tuning", "--json")
    assert (
        code == 0
        and not (cache / "tvm-tuning").exists()
        and sorted(p.name for p in cache.iterdir()) == ["arm64-board"]
    )
