"""The TVM profiler keeps the library of every kernel it compiles (``<cache>/tvm-libs``), loads it
when the same kernel is profiled again, and goes on without keeping where it cannot export one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import make_model
from onnx import helper

import edgesplit.backends.tvm.profile as tvm_profiler
from edgesplit.backends.tvm.profile import profile_tvm
from edgesplit.device.spec import load_device
from edgesplit.model.load import load_model


@pytest.fixture
def cpu_tvm(monkeypatch, tmp_path):
    """A private cache, and the host's CPU with its TVM backend."""
    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    cpu = load_device("host").processor("cpu")
    (tvm,) = [b for b in cpu.backends if b.key == "tvm"]
    return cpu, tvm


def _two_kernels(tmp_path):
    """MatMul -> Relu (one fused kernel) then Sigmoid after a Transpose (another)."""
    w = helper.make_tensor("w", 1, [16, 16], np.ones(256, np.float32) / 16)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], name="tr", perm=[1, 0]),
        helper.make_node("Sigmoid", ["t"], ["y"], name="sig"),
    ]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [("x", [4, 16])], [("y", [16, 4])], weights=[w]), path)
    return load_model(path)


@pytest.mark.slow
def test_a_kernel_profiled_again_is_loaded_not_compiled(cpu_tvm, tmp_path, monkeypatch):
    cpu, tvm = cpu_tvm
    graph = _two_kernels(tmp_path)
    first = profile_tvm(graph, cpu, tvm, runs=3)
    assert set(first.nodes) == {"mm", "relu", "tr", "sig"} and not first.unsupported
    kept = sorted((tmp_path / "cache" / "tvm-libs").glob("*.so"))
    assert len(kept) >= 3  # the kernels, the whole model, the micro-models of the part terms

    def no_compiler(*_a, **_k):
        raise AssertionError("compiled again")

    monkeypatch.setattr(tvm_profiler, "_compile", no_compiler)
    again = profile_tvm(graph, cpu, tvm, runs=3)
    # every kernel loaded from the cache (a failed build would leave nodes unsupported)
    assert set(again.nodes) == set(first.nodes) and not again.unsupported
    assert again.whole_model_ms is not None and again.terms is not None
    assert sorted((tmp_path / "cache" / "tvm-libs").glob("*.so")) == kept


@pytest.mark.slow
def test_without_a_c_compiler_the_profile_is_made_and_nothing_kept(cpu_tvm, tmp_path, monkeypatch):
    """TVM links a library with the C compiler it finds (``CXX`` first): none there, the compiled
    module runs as it is (a device without a compiler can still be profiled)."""
    cpu, tvm = cpu_tvm
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    graph = _two_kernels(tmp_path)
    prof = profile_tvm(graph, cpu, tvm, runs=3)
    assert set(prof.nodes) == {"mm", "relu", "tr", "sig"} and not prof.unsupported
    assert prof.whole_model_ms is not None
    assert not list((tmp_path / "cache" / "tvm-libs").glob("*.so"))


def test_the_profiler_and_the_compiler_keep_their_builds_apart(cpu_tvm, tmp_path):
    """The same model built by each: two kept libraries (their builders' sources key them)."""
    from edgesplit.backends.tvm.build import build_library

    cpu, _ = cpu_tvm
    relu = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 8])], [("y", [1, 8])]
    )
    tvm_profiler.build_vm(relu, {"kind": "llvm"}, cpu.threads)
    assert len(list((tmp_path / "cache" / "tvm-libs").glob("*.so"))) == 1
    build_library(relu, {"kind": "llvm"}, tmp_path / "a.so", threads=cpu.threads)
    assert len(list((tmp_path / "cache" / "tvm-libs").glob("*.so"))) == 2


def test_a_code_tag_reads_a_source_inside_a_zip_archive(tmp_path, monkeypatch):
    """The profiling agent runs edgesplit from a zip archive: the sources that key kept work are
    read through their loader there (a plain file read failed: the archive is not a folder)."""
    import hashlib
    import sys
    import zipfile

    from edgesplit.cache import code_tag

    archive = tmp_path / "agent.pyz"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_mod.py", "X = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.delitem(sys.modules, "zipped_mod", raising=False)
    __import__("zipped_mod")
    assert code_tag("zipped_mod") == hashlib.sha256(b"X = 1\n").hexdigest()
    monkeypatch.delitem(sys.modules, "zipped_mod")
