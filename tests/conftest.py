"""Shared fixtures: tiny models built in code, the real PP-OCR models from a PyPI package."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import settings
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent

# Property tests run 100 examples each; the quick subset (README) passes --hypothesis-profile=quick.
settings.register_profile("full", max_examples=100)
settings.register_profile("quick", max_examples=20)
settings.load_profile("full")


def max_examples(n: int) -> int:
    """``n`` examples for a test that sets its own count, or the quick profile's fewer: call it in
    ``@settings(...)`` (test modules are imported after ``--hypothesis-profile`` is applied)."""
    return min(n, settings.default.max_examples)


def make_model(nodes, inputs, outputs, weights=(), opset=17, value_info=()) -> onnx.ModelProto:
    """A model from onnx.helper pieces; inputs/outputs are (name, shape) or value infos."""

    def vi(x):
        if isinstance(x, onnx.ValueInfoProto):
            return x
        name, shape = x
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    inits = [w if isinstance(w, onnx.TensorProto) else numpy_helper.from_array(w[1], w[0]) for w in weights]
    g = helper.make_graph(
        list(nodes),
        "g",
        [vi(i) for i in inputs],
        [vi(o) for o in outputs],
        inits,
        value_info=list(value_info),
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def rand(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.1


@pytest.fixture
def tiny_conv(tmp_path) -> Path:
    """Conv -> Relu -> (two branches) -> Add -> GlobalAveragePool -> Flatten -> Gemm."""
    m = make_model(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
            helper.make_node("Sigmoid", ["r1"], ["s1"], name="sig"),
            helper.make_node("Add", ["c2", "s1"], ["a"], name="add"),
            helper.make_node("GlobalAveragePool", ["a"], ["p"], name="gap"),
            helper.make_node("Flatten", ["p"], ["f"], name="flat"),
            helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
        ],
        [("x", [1, 3, 16, 16])],
        [("y", [1, 10])],
        [
            ("w1", rand(8, 3, 3, 3)),
            ("b1", rand(8)),
            ("w2", rand(8, 8, 3, 3, seed=1)),
            ("wf", rand(10, 8, seed=2)),
            ("bf", rand(10, seed=3)),
        ],
    )
    p = tmp_path / "tiny.onnx"
    onnx.save(m, p)
    return p


def gpu_spec(name: str, kind: str = "device", target: str = "{kind: cuda}", header: str = "") -> str:
    """A spec (YAML) with one GPU processor whose backend is TVM on ``target``; ``header``: more
    top-level lines (``local: true``, a description)."""
    return (
        f"name: {name}\nkind: {kind}\n{header}processors:\n  gpu:\n    kind: gpu\n    peak_gflops: 10000\n"
        f"    mem_bandwidth_gbps: 1000\n    active_w: 200\n    idle_w: 30\n"
        f"    backends: [{{runtime: tvm, target: {target}}}]\n"
    )


def has_cuda_gpu() -> bool:
    """Whether TVM sees a CUDA GPU. Asked at collection: without an NVIDIA device node there is
    none, and TVM is not imported (importing it took 2.3 s of every worker's collection)."""
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return False
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001
        return False


def ppocr_model(kind: str) -> Path:
    """A real PP-OCR model shipped inside the rapidocr-onnxruntime wheel (installed by setup)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime is not installed (scripts/setup.sh installs it)")
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    found = sorted(models.glob(f"*{kind}*.onnx"))
    if not found:
        pytest.skip(f"no PP-OCR {kind} model in {models}")
    return found[0]


PPOCR_SHAPES = {"det": "x=1,3,640,640", "rec": "x=1,3,48,320", "cls": "x=1,3,48,192"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the markers true: a test that starts a real sshd (its fixtures) carries ``ssh``. Under
    xdist, list the ``measures`` tests for the scheduler (:func:`pytest_xdist_make_scheduler`)."""
    unmarked = [
        item.nodeid
        for item in items
        if {"sshd", "remote_tmp"} & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("ssh") is None
    ]
    if unmarked:
        raise pytest.UsageError("tests that use tests/sshd.py need @pytest.mark.ssh: " + ", ".join(unmarked))
    if "PYTEST_XDIST_WORKER" in os.environ:
        # for the scheduler (below), which sees node ids only; every worker writes the same list
        measuring = "".join(item.nodeid + "\n" for item in items if _measures(item))
        tmp = _run_dir() / f"measures.{os.environ['PYTEST_XDIST_WORKER']}.tmp"
        tmp.write_text(measuring)
        tmp.replace(_run_dir() / MEASURES_LIST)


# ---- tests that time real runs run alone, also under pytest-xdist
#
# A test marked ``measures`` compares real run times with a prediction or with each other. On a
# 2-core machine a second worker is load on one of the cores it measures (seen: a core slowed 2.8x
# against the other, and a calibration test that then failed). So under xdist every test holds a
# shared lock for its whole run (setup, call, teardown), and a ``measures`` test an exclusive one:
# it waits for the other workers' current tests to end, and they wait for it. A turnstile taken
# before either lock keeps a stream of shared holders from starving the exclusive one. Serial runs
# take no locks. flock locks die with their process, so a killed worker leaves none held.


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


class RunLock:
    """One worker's hold on the lock of the test run whose lock files are in ``folder``: exclusive
    for a ``measures`` test, else shared (see above). An exclusive hold may be kept from one
    ``measures`` test to the next, so that a run of them waits once for the other workers' current
    tests, not before each (a shared hold is never kept: a waiting exclusive one would starve)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def take(self, alone: bool) -> None:
        """Wait for the lock (exclusive when ``alone``); nothing to do while it is held already."""
        if self._fd is not None:
            return
        with _flock(self.folder / "turnstile.lock", fcntl.LOCK_EX):
            fd = os.open(self.folder / "run.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


@contextmanager
def running_alone(alone: bool, folder: Path) -> Iterator[None]:
    """Hold the lock of the test run whose lock files are in ``folder`` for one test."""
    lock = RunLock(folder)
    lock.take(alone)
    try:
        yield
    finally:
        lock.release()


def _measures(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("measures") is not None


# Under pytest-xdist the ``measures`` tests of every module form one unit of work, handed out first:
# one worker runs them one after the other under one exclusive hold, early, while the other workers
# wait once. Spread over their modules, each waited for the other worker's current test to end,
# which could be a 20-s one (35 s of one worker's run went so). The workers list them in the run's
# folder at collection (the scheduler in this process sees node ids only).
RUN_DIR = "EDGESPLIT_TEST_RUN_DIR"  # the run's lock files and list; made here, inherited by workers
MEASURES_LIST = "measures.txt"
MEASURES_UNIT = "(measures)"


def _run_dir() -> Path:
    return Path(os.environ[RUN_DIR])


def pytest_configure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="edgesplit-tests-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        shutil.rmtree(os.environ.pop(RUN_DIR), ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class MeasuresFirst(LoadScopeScheduling):
        measuring: frozenset[str] = frozenset()

        def schedule(self) -> None:
            listed = _run_dir() / MEASURES_LIST  # absent where collection stopped on an error
            if self.collection is None and listed.exists():  # the first call: every worker collected
                self.measuring = frozenset(listed.read_text().splitlines())
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return MEASURES_UNIT if nodeid in self.measuring else super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if MEASURES_UNIT in self.workqueue:
                self.workqueue.move_to_end(MEASURES_UNIT, last=False)
            super()._assign_work_unit(node)

    return MeasuresFirst(config, log)


_RUN_LOCK: list[RunLock] = []  # this worker's, made at its first test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    if not _RUN_LOCK:
        _RUN_LOCK.append(RunLock(_run_dir()))
    lock = _RUN_LOCK[0]
    lock.take(_measures(item))
    try:
        yield
    finally:
        if not (_measures(item) and _measures(nextitem)):
            lock.release()


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real console script in a subprocess (exit codes and stderr as a user sees them)."""
    exe = Path(sys.executable).with_name("edgesplit")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "edgesplit"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
