"""Compile and run: bundles reproduce the whole model, bad bundles and inputs are refused."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import PPOCR_SHAPES, has_cuda_gpu, make_model, ppocr_model, run_cli

from edgesplit.compile.manual import contiguous_plan
from edgesplit.errors import BundleError, PlanError, RunInputError
from edgesplit.model import zoo
from edgesplit.model.load import load_model, parse_input_shapes
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.compile import compile_bundle

ZOO = [
    "mobilenetv2",
    "resnet18",
    "squeezenet",
    "googlenet",
    "transformer",
    "transformer_large",
    "lstm",
    "chain_shrink",
    "tiny_dag",
]
# bundles that take seconds each; lstm, chain_shrink and tiny_dag stay in the quick subset
HEAVY = {"mobilenetv2", "resnet18", "squeezenet", "googlenet", "transformer", "transformer_large"}
SITES = {
    1: [("big", "ort")],
    2: [("big", "ort"), ("little", "ort")],
    4: [("big", "ort"), ("little", "ort"), ("big", "ort"), ("little", "ort")],
}


def _whole(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _check_equal(got, want):
    """Within 1e-4 of the tensor's largest magnitude (and 1e-6 absolute, for all-but-zero
    outputs)."""
    assert set(got) == set(want)
    for k in want:
        err = float(np.max(np.abs(got[k] - want[k])))
        assert err <= 1e-4 * float(np.max(np.abs(want[k]))) + 1e-6, (k, err)


class _Zoo(dict):
    """Zoo model name -> its saved path, each saved when a test first asks for it."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        self[name] = path = zoo.save(name, self.root / f"{name}.onnx")
        return path


@pytest.fixture(scope="module")
def zoo_models(tmp_path_factory):
    return _Zoo(tmp_path_factory.mktemp("zoo"))


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in ZOO]
)
def test_bundle_equals_whole_model_for_1_2_4_parts(name, zoo_models, tmp_path):
    graph = load_model(zoo_models[name])
    for n, sites in SITES.items():
        plan = contiguous_plan(graph, "host-biglittle", sites)
        compile_bundle(graph, plan, tmp_path / f"b{n}")
        with load(tmp_path / f"b{n}") as sess:
            assert len(sess.manifest.parts) == n
            feeds = random_feeds(sess, seed=n)
            _check_equal(sess.run(feeds), _whole(zoo_models[name], feeds))


@pytest.mark.slow
def test_real_ppocr_model_bundles(tmp_path):
    path = ppocr_model("det")
    graph = load_model(path, parse_input_shapes([PPOCR_SHAPES["det"]]))
    for n, sites in SITES.items():
        compile_bundle(graph, contiguous_plan(graph, "host-biglittle", sites), tmp_path / f"b{n}")
        with load(tmp_path / f"b{n}") as sess:
            # an image-like input in [0, 1]: random normals drive the detector's output to ~0
            feeds = {"x": np.random.default_rng(n).random((1, 3, 640, 640), dtype=np.float32)}
            _check_equal(sess.run(feeds), _whole(path, feeds))


@pytest.fixture(scope="module")
def tvm_bundle(zoo_models, tmp_path_factory):
    """tiny_dag as a TVM part on big and an ORT part on little, compiled once for the module."""
    graph = load_model(zoo_models["tiny_dag"])
    plan = contiguous_plan(graph, "host-biglittle", [("big", "tvm"), ("little", "ort")])
    out = tmp_path_factory.mktemp("tvm_bundle") / "b"
    return out, compile_bundle(graph, plan, out)


def test_tvm_part_matches_and_concurrent_parts_run(zoo_models, tvm_bundle):
    path, m = tvm_bundle
    assert m.parts[0].backend == "tvm" and m.parts[0].file.endswith(".so")
    assert "max rel error vs ORT" in m.parts[0].note
    with load(path) as sess:
        feeds = random_feeds(sess)
        _check_equal(sess.run(feeds), _whole(zoo_models["tiny_dag"], feeds))
        outs = list(sess.run_stream([feeds] * 6))
        assert len(outs) == 6
        st = sess.stats()
        assert [p.runs for p in st.parts] == [7, 7] and st.runs == 7


def test_tvm_failure_falls_back_to_ort_and_says_why(zoo_models, tmp_path):
    graph = load_model(zoo_models["lstm"])  # TVM has no LSTM converter
    plan = contiguous_plan(graph, "host-biglittle", [("big", "tvm")])
    m = compile_bundle(graph, plan, tmp_path / "b")
    assert m.parts[0].backend == "ort" and "TVM failed" in m.parts[0].note
    assert any("runs on ORT instead" in n for n in m.notes)


ARM_SPEC = (
    "name: arm\nkind: device\nprocessors:\n  cpu: {kind: cpu, peak_gflops: 50, mem_bandwidth_gbps: "
    "10,"
    " active_w: 2, idle_w: 0.1, backends: [{runtime: tvm, target: {kind: llvm,"
    " mtriple: aarch64-linux-gnu, mattr: [+neon]}}]}\n"
)


def _compile_for_arm(model, tmp_path):
    """``edgesplit compile`` of the whole model as one TVM part for an aarch64 device."""
    spec = tmp_path / "arm.yaml"
    spec.write_text(ARM_SPEC)
    graph = load_model(model)
    (tmp_path / "plan.json").write_text(
        json.dumps(contiguous_plan(graph, str(spec), [("cpu", "tvm")]).to_json())
    )
    out = tmp_path / "b"
    args = [
        "compile",
        str(model),
        "--plan",
        str(tmp_path / "plan.json"),
        "-o",
        str(out),
        "--device",
        str(spec),
    ]
    # a private cache: the part is cross-compiled every time, not copied from an earlier build
    return run_cli(*args, env={**os.environ, "EDGESPLIT_CACHE": str(tmp_path / "cache")}), out


def elf_machine(path) -> tuple[bytes, int, int]:
    """(magic, e_type, e_machine) of a 64-bit little-endian ELF file."""
    import struct

    head = path.read_bytes()[:20]
    assert head[4:6] == b"\x02\x01", "not a 64-bit little-endian ELF"
    return head[:4], *struct.unpack_from("<HH", head, 16)


@pytest.mark.slow
@pytest.mark.skipif(
    __import__("shutil").which("aarch64-linux-gnu-gcc") is None,
    reason="needs the aarch64 cross compiler (scripts/setup.sh installs gcc-aarch64-linux-gnu as "
    "root)",
)
def test_cross_compiled_part_is_an_aarch64_shared_object(zoo_models, tmp_path):
    r, out = _compile_for_arm(zoo_models["tiny_dag"], tmp_path)
    assert r.returncode == 0, r.stderr
    (part,) = json.loads((out / "manifest.json").read_text())["parts"]
    assert part["backend"] == "tvm", part
    libs = sorted(out.glob("parts/*.so"))
    assert len(libs) == 1
    magic, e_type, e_machine = elf_machine(libs[0])
    assert magic == b"\x7fELF" and e_type == 3 and e_machine == 183  # ET_DYN, EM_AARCH64


@pytest.mark.slow
def test_a_tvm_library_is_kept_and_built_again_only_when_its_inputs_change(tmp_path, monkeypatch):
    """A second build of the same part for the same target copies the kept library (the same bytes,
    the same facts) without compiling; another thread count or a changed model is built again."""
    import tvm

    from edgesplit.backends.tvm.build import build_library
    from edgesplit.device.host import llvm_target

    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    w = np.arange(8, dtype=np.float32).reshape(1, 8)
    model = make_model(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [("x", [1, 8])],
        [("y", [1, 8])],
        [("w", w)],
    )
    first = build_library(model, llvm_target(), tmp_path / "a.so", threads=1)
    assert "kept" not in first
    builds = []
    real = tvm.compile
    monkeypatch.setattr(tvm, "compile", lambda *a, **k: builds.append(1) or real(*a, **k))
    again = build_library(model, llvm_target(), tmp_path / "b.so", threads=1)
    assert builds == [] and (tmp_path / "b.so").read_bytes() == (tmp_path / "a.so").read_bytes()
    assert Path(again.pop("kept")).is_file() and again == first
    build_library(model, llvm_target(), tmp_path / "c.so", threads=2)  # another tuning target
    assert builds == [1]
    w = model.graph.initializer[0]
    w.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w) + 1.0, w.name))
    assert "kept" not in build_library(model, llvm_target(), tmp_path / "d.so", threads=1)
    assert builds == [1, 1]


def test_missing_cross_toolchain_is_named(zoo_models, tmp_path, monkeypatch):
    from edgesplit.errors import CompileError

    # a PATH with only this venv's bin folder: no aarch64-linux-gnu-gcc, installed or not
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    spec = tmp_path / "arm.yaml"
    spec.write_text(ARM_SPEC)
    graph = load_model(zoo_models["tiny_dag"])
    plan = contiguous_plan(graph, str(spec), [("cpu", "tvm")])
    with pytest.raises(
        CompileError, match=r"aarch64-linux-gnu-gcc.*apt-get install gcc-aarch64-linux-gnu"
    ):
        compile_bundle(graph, plan, tmp_path / "b", device=str(spec))
    assert CompileError.exit_code == 1 and not (tmp_path / "b").exists()


@pytest.fixture
def bundle(tvm_bundle, tmp_path):
    """A copy of the module's TVM bundle, for a test to tamper with."""
    shutil.copytree(tvm_bundle[0], tmp_path / "b")
    return tmp_path / "b"


def _native_libs_loaded_after(bundle_dir) -> tuple[int, str]:
    """Run `edgesplit run` in a subprocess; report whether it loaded the bundle's .so."""
    code = (
        "import sys, os\n"
        "from edgesplit.cli.main import main\n"
        "import atexit\n"
        f"atexit.register(lambda: print('LOADED' if any('{bundle_dir}' in l for l in "
        "open('/proc/self/maps')) else 'CLEAN'))\n"
        f"main(['run', '{bundle_dir}', '--repeat', '1'])\n"
    )
    import subprocess

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_tampered_library_is_refused_before_loading(bundle):
    lib = bundle / "parts" / "p0.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="p0.so: checksum mismatch"):
        load(bundle)
    code, out = _native_libs_loaded_after(bundle)
    assert code == 2 and "checksum mismatch" in out and "CLEAN" in out and "Traceback" not in out


def test_missing_file_and_other_format_version(bundle):
    (bundle / "parts" / "p1.onnx").unlink()
    with pytest.raises(BundleError, match="p1.onnx: missing"):
        load(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["format_version"] = 2
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    r = run_cli("run", str(bundle))
    assert (
        r.returncode == 2
        and "format version 2" in r.stderr
        and len(r.stderr.strip().splitlines()) == 1
    )


def test_plan_for_another_model(zoo_models, tmp_path):
    plan = contiguous_plan(load_model(zoo_models["tiny_dag"]), "host-biglittle", [("big", "ort")])
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    with pytest.raises(PlanError, match="does not fit"):
        compile_bundle(zoo_models["chain_shrink"], tmp_path / "plan.json", tmp_path / "b")
    r = run_cli(
        "compile",
        str(zoo_models["chain_shrink"]),
        "--plan",
        str(tmp_path / "plan.json"),
        "-o",
        str(tmp_path / "b"),
    )
    assert r.returncode == 2 and "does not fit" in r.stderr and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_wrong_inputs_name_the_expected(bundle, tmp_path):
    with load(bundle) as sess:
        good = random_feeds(sess)
        with pytest.raises(RunInputError, match="expected input.*unknown x"):
            sess.run({"x": good["input"]})
        with pytest.raises(RunInputError, match=r"shape \(1, 3, 8, 8\), expected \(1, 3, 32, 32\)"):
            sess.run({"input": np.zeros((1, 3, 8, 8), np.float32)})
        with pytest.raises(RunInputError, match="dtype float64, expected float32"):
            sess.run({"input": good["input"].astype(np.float64)})
    np.save(tmp_path / "bad.npy", np.zeros((2, 2), np.float32))
    r = run_cli("run", str(bundle), "--input", f"input={tmp_path / 'bad.npy'}")
    assert r.returncode == 2 and "expected (1, 3, 32, 32)" in r.stderr


@pytest.mark.slow
def test_cli_compile_and_run(zoo_models, tmp_path):
    graph = load_model(zoo_models["tiny_dag"])
    (tmp_path / "plan.json").write_text(
        json.dumps(
            contiguous_plan(graph, "host-biglittle", [("big", "ort"), ("little", "ort")]).to_json()
        )
    )
    r = run_cli(
        "compile",
        str(zoo_models["tiny_dag"]),
        "--plan",
        str(tmp_path / "plan.json"),
        "-o",
        str(tmp_path / "b"),
    )
    assert r.returncode == 0, r.stderr
    r = run_cli(
        "run", str(tmp_path / "b"), "--repeat", "5", "--stream", "8", "-o", str(tmp_path / "out")
    )
    assert r.returncode == 0, r.stderr
    assert "per-part timings" in r.stdout and "stream of 8" in r.stdout
    assert (tmp_path / "out" / "logits.npy").exists()


def _matmul(path):
    """One 16x32 @ 32x16 MatMul: the smallest model with a MetaSchedule task."""
    from conftest import make_model, rand
    from onnx import helper

    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [("x", [16, 32])],
        [("y", [16, 16])],
        [("w", rand(32, 16))],
    )
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


@pytest.mark.slow
def test_a_tuning_database_is_kept_per_target_and_reused(tmp_path, monkeypatch):
    """Builds apply the database in the target's cache folder, even with 0 trials, unless told not
    to."""
    from tvm.s_tir import meta_schedule as ms

    from edgesplit.backends.tvm.build import build_library, tuning_dir
    from edgesplit.device.host import llvm_target

    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    target = llvm_target()
    db = tuning_dir(target)
    assert db.parent == tmp_path / "cache" / "tvm-tuning"
    assert tuning_dir({**target, "mattr": ["+neon"]}) != db  # one database per target
    m = onnx.load(_matmul(tmp_path / "mm.onnx"))
    assert "tuning_database" not in build_library(m, target, tmp_path / "a.so")  # none yet
    db.mkdir(parents=True)
    ms.database.JSONDatabase(work_dir=str(db))  # the files a tuning run leaves, as TVM writes them
    assert build_library(m, target, tmp_path / "b.so")["tuning_database"] == str(db)
    assert "tuning_database" not in build_library(m, target, tmp_path / "c.so", databases=None)
    assert all((tmp_path / f"{n}.so").stat().st_size > 0 for n in "abc")


TUNE_AND_REBUILD = """
import json, sys
from pathlib import Path
import onnx
from edgesplit.backends.tvm.build import build_library
from edgesplit.device.host import llvm_target
m, out = onnx.load(sys.argv[1]), Path(sys.argv[2])
first = build_library(m, llvm_target(), out / "tuned.so", tune_trials=1)
again = build_library(m, llvm_target(), out / "again.so")
print(json.dumps([first, again]))
"""


@pytest.mark.slow
def test_metaschedule_tuning_writes_the_database_a_later_build_reuses(tmp_path, monkeypatch):
    """One trial of real MetaSchedule tuning, then a build with 0 trials that finds its database.

    It runs in a fresh process: TVM registers its tensor intrinsics when tuning starts, through
    ``inspect.stack()``, whose cost grows with the number of modules loaded, and this test
    process has several times more than a fresh one.
    """
    import base64
    import os
    import subprocess

    from edgesplit.backends.tvm.build import tuning_dir
    from edgesplit.device.host import llvm_target

    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    model = _matmul(tmp_path / "mm.onnx")
    r = subprocess.run(
        [sys.executable, "-c", TUNE_AND_REBUILD, str(model), str(tmp_path)],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    first, again = json.loads(r.stdout.strip().splitlines()[-1])
    db = tuning_dir(llvm_target())
    assert first["tune_trials"] == 1 and first["tuning_database"] == again[
        "tuning_database"
    ] == str(db)
    workloads = (db / "database_workload.json").read_text().splitlines()
    records = (db / "database_tuning_record.json").read_text().splitlines()
    (workload,) = (json.loads(w) for w in workloads)  # [structural hash, base64 of the TIR module]
    assert b"matmul" in base64.b64decode(workload[1])
    # Records of that workload. (Whether its builds succeeded depends on the machine: a loaded one
    # can time out MetaSchedule's 30 s builder; the record is written either way.)
    assert records and all(json.loads(rec)[0] == 0 for rec in records)
    assert (tmp_path / "tuned.so").stat().st_size > 0 and (tmp_path / "again.so").stat().st_size > 0


GPU_SPEC = (
    "name: gpu\nkind: device\nlocal: true\nprocessors:\n  gpu: {{kind: gpu, peak_gflops: 10000,"
    " mem_bandwidth_gbps: 1000, active_w: 200, idle_w: 30, backends: [{{runtime: tvm,"
    " target: {target}}}]}}\n"
)


def _cuda_bundle(zoo_models, tmp_path, target="{kind: cuda}"):
    """tiny_dag as one TVM CUDA part, compiled here (for this machine's GPU, unless ``target``)."""
    spec = tmp_path / "gpu.yaml"
    spec.write_text(GPU_SPEC.format(target=target))
    graph = load_model(zoo_models["tiny_dag"])
    plan = contiguous_plan(graph, str(spec), [("gpu", "tvm")])
    return compile_bundle(graph, plan, tmp_path / "b", device=str(spec))


@pytest.mark.slow
@pytest.mark.skipif(has_cuda_gpu(), reason="checks a build machine without a CUDA driver")
def test_a_cuda_part_builds_without_a_gpu_and_names_what_it_needs_to_load(zoo_models, tmp_path):
    """TVM keeps the kernels as CUDA source where no driver is (compiled where the part loads: the
    H200 check in benchmarks/server_gpu.py ran such bundles); loading one here is refused with the
    cause, not TVM's "a loader of that name is not registered"."""
    m = _cuda_bundle(zoo_models, tmp_path, "{kind: cuda, arch: sm_90}")  # an H100 or H200
    assert m.parts[0].backend == "tvm" and m.parts[0].target["kind"] == "cuda"
    assert "CUDA kernels as source" in m.parts[0].note
    with pytest.raises(
        BundleError, match=r"part p0: its cuda runtime does not load on this machine \(lib"
    ):
        load(tmp_path / "b")


@pytest.mark.cuda
@pytest.mark.skipif(not has_cuda_gpu(), reason="needs a CUDA GPU (none on the CI machine)")
def test_cuda_part_runs_and_matches(zoo_models, tmp_path):
    m = _cuda_bundle(zoo_models, tmp_path)
    assert "max rel error vs ORT" in m.parts[0].note  # compile checked it on the GPU
    with load(tmp_path / "b") as sess:
        feeds = random_feeds(sess)
        _check_equal(sess.run(feeds), _whole(zoo_models["tiny_dag"], feeds))
