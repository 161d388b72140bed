"""ONNX's backend test models, run by ONNX Runtime and through edgesplit's whole pipeline.

The cases ship inside the ``onnx`` wheel: ``node`` (built in memory from
``onnx.backend.test.case.node``, as ONNX's own runner does), ``simple``, ``pytorch-converted`` and
``pytorch-operator`` (``onnx/backend/test/data/<folder>/<case>/model.onnx`` with
``test_data_set_0/*.pb``), and ``real`` (the ``light_*.onnx`` models its ``data.json`` points at,
fed ONNX's dummy inputs and compared with the shipped ``light_*_output_0.pb``). Outputs are
compared as ONNX's runner compares them (``Runner.assert_similar_outputs``, the case's rtol and
atol).

edgesplit's pipeline: load -> profile and partition on ``host-2core`` (two processors; nodes pinned
in alternating runs so that larger models are cut into several parts) -> compile -> run the bundle.
A case's result is ``(stage, reason)``: stage ``"pass"`` or the stage that failed.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import math
import os
import pkgutil
import random
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
FOLDERS = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")
DEVICE = "host-2core"
PROCESSORS = ("core0", "core1")
STAGES = ("load", "profile", "partition", "compile", "run", "compare")


@dataclass
class Case:
    """One backend test model with its first data set."""

    folder: str
    name: str
    rtol: float
    atol: float
    model: onnx.ModelProto = field(repr=False)
    inputs: list[Any] = field(repr=False)
    outputs: list[Any] = field(repr=False)

    @property
    def key(self) -> str:
        return f"{self.folder}/{self.name}"

    def feeds(self) -> dict[str, Any]:
        """Input name -> value (the model's non-weight inputs, in order)."""
        weights = {t.name for t in self.model.graph.initializer}
        names = [i.name for i in self.model.graph.input if i.name not in weights]
        return dict(zip(names, self.inputs))


def _normalize(value: Any) -> Any:
    """A data set's value as ONNX's runner feeds it: tensors and numpy scalars as arrays."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value) if isinstance(value, np.generic) else value


def _read_proto(path: str, type_proto: onnx.TypeProto) -> Any:
    data = Path(path).read_bytes()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    if type_proto.HasField("map_type"):
        m = onnx.MapProto()
        m.ParseFromString(data)
        return numpy_helper.to_dict(m)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return numpy_helper.to_array(t)


def _tolerances(case_dir: Path) -> tuple[float, float]:
    info = case_dir / "data.json"
    data = json.loads(info.read_text()) if info.is_file() else {}
    return float(data.get("rtol", 1e-3)), float(data.get("atol", 1e-7))


def _data_case(folder: str, case_dir: Path) -> Case:
    model = onnx.load(case_dir / "model.onnx")
    rtol, atol = _tolerances(case_dir)
    data_dir = case_dir / "test_data_set_0"
    weights = {t.name for t in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in weights]
    n_in = len(glob.glob(str(data_dir / "input_*.pb")))
    n_out = len(glob.glob(str(data_dir / "output_*.pb")))
    inputs = [_read_proto(str(data_dir / f"input_{i}.pb"), ins[i].type) for i in range(n_in)]
    outputs = [
        _read_proto(str(data_dir / f"output_{i}.pb"), model.graph.output[i].type)
        for i in range(n_out)
    ]
    return Case(folder, case_dir.name, rtol, atol, model, inputs, outputs)


def _real_case(case_dir: Path) -> Case | None:
    """A ``real`` case whose model ships as ``light/light_<name>.onnx`` (no download)."""
    from onnx.backend.test.runner import Runner

    info = json.loads((case_dir / "data.json").read_text())
    url = str(info.get("url", ""))
    if not url.startswith("onnx/backend/test/data/light/"):
        return None
    path = DATA.parent.parent.parent.parent / url
    model = onnx.load(path)
    weights = {t.name for t in model.graph.initializer}
    inputs = [
        Runner.generate_dummy_data(i, seed=0, name=info["model_name"], random=False)
        for i in model.graph.input
        if i.name not in weights
    ]
    prefix = str(path)[: -len(".onnx")]
    outputs = [
        _read_proto(f"{prefix}_output_{k}.pb", o.type) for k, o in enumerate(model.graph.output)
    ]
    return Case(
        "real", case_dir.name, float(info["rtol"]), float(info["atol"]), model, inputs, outputs
    )


def node_modules() -> list[str]:
    """The modules of ``onnx.backend.test.case.node`` (each defines a few cases)."""
    import onnx.backend.test.case.node as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__))


_BY_MODULE: dict[str, list] = {}  # node case module -> the onnx TestCases its import registered


def _node_cases(modules: Sequence[str] | None) -> list[Case]:
    """Node cases as ONNX's runner builds them: importing a module registers its cases."""
    import warnings

    import onnx.backend.test.case.node as pkg
    from onnx.backend.test.case.utils import import_recursive

    wanted = list(modules) if modules is not None else node_modules()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for m in wanted:
            if m in _BY_MODULE:
                continue
            before = len(pkg._NodeTestCases)
            mod = importlib.import_module(f"{pkg.__name__}.{m}")
            if hasattr(mod, "__path__"):  # a package (ai_onnx_ml): its modules hold the cases
                import_recursive(mod)
            _BY_MODULE[m] = pkg._NodeTestCases[before:]
    out = []
    seen = set()
    for tc in (tc for m in wanted for tc in _BY_MODULE[m]):
        if tc.name in seen:
            continue
        seen.add(tc.name)
        inputs, outputs = tc.data_sets[0]
        out.append(
            Case(
                "node",
                tc.name,
                tc.rtol,
                tc.atol,
                tc.model,
                [_normalize(v) for v in inputs],
                [_normalize(v) for v in outputs],
            )
        )
    return out


def data_case(folder: str, name: str) -> Case:
    """One case of a data folder (``simple``, ``pytorch-*``, ``real``) by name."""
    case = (
        _real_case(DATA / folder / name)
        if folder == "real"
        else _data_case(folder, DATA / folder / name)
    )
    if case is None:
        raise ValueError(f"{folder}/{name}: no model shipped")
    return case


def units(folder: str) -> list[str]:
    """What a sample picks from: node case modules, or the cases of a data folder."""
    if folder == "node":
        return node_modules()
    return sorted(d.name for d in (DATA / folder).iterdir() if d.is_dir())


_SUFFIX = re.compile(r"(_expanded)?(_ver\d+)?$")


def node_module_of(case_name: str) -> str | None:
    """The node case module that defines ``case_name``, from the modules' sources (no import):
    the one naming it in a string, or the longest ``"test_..."`` string it starts with (names
    built from parts; ``_expanded`` cases come with the case they expand)."""
    import onnx.backend.test.case.node as pkg

    base = _SUFFIX.sub("", case_name)
    best: tuple[int, str] | None = None
    root = Path(pkg.__path__[0])
    for m in node_modules():
        files = (
            [root / f"{m}.py"] if (root / f"{m}.py").is_file() else sorted((root / m).rglob("*.py"))
        )
        text = "".join(f.read_text() for f in files)
        for lit in re.findall(r'"(test_[A-Za-z0-9_]*)"', text):
            if lit == base or lit == case_name:
                return m
            if base.startswith(lit) and (best is None or len(lit) > best[0]):
                best = (len(lit), m)
    return best[1] if best else None


def cases(folder: str, node_module_names: Sequence[str] | None = None) -> list[Case]:
    """Every case of ``folder`` (for ``node``, of the given case modules only), sorted by name."""
    if folder == "node":
        found = _node_cases(node_module_names)
    elif folder == "real":
        found = [c for d in sorted((DATA / "real").iterdir()) if (c := _real_case(d)) is not None]
    else:
        found = [_data_case(folder, d) for d in sorted((DATA / folder).iterdir()) if d.is_dir()]
    return sorted(found, key=lambda c: c.name)


def assert_similar(case: Case, got: Sequence[Any]) -> None:
    """ONNX's own comparison, with the case's tolerances (raises AssertionError)."""
    from onnx.backend.test.runner import Runner

    Runner.assert_similar_outputs(list(case.outputs), list(got), case.rtol, case.atol, case.key)


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__)[:300]


# ---- ONNX Runtime on the original model: the denominator


def run_ort(case: Case) -> tuple[str, str]:
    """``("pass", "")``, or the stage (``session``, ``run``, ``compare``) and why."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(
            case.model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # noqa: BLE001
        return "session", first_line(e)
    names = [i.name for i in sess.get_inputs()]
    try:
        got = sess.run(None, dict(zip(names, case.inputs)))
    except Exception as e:  # noqa: BLE001
        return "run", first_line(e)
    try:
        assert_similar(case, got)
    except Exception as e:  # noqa: BLE001
        return "compare", first_line(e)
    return "pass", ""


# ---- edgesplit's pipeline


def pins_for(graph, parts: int = 3) -> dict[str, str]:
    """Nodes pinned in ``parts`` contiguous runs alternating between the two processors (fewer runs
    for fewer nodes): the plan cuts the model there, so each run's first and last op types cross a
    part boundary."""
    n = len(graph.nodes)
    k = min(parts, n)
    if k < 2:
        return {}
    size = math.ceil(n / k)
    return {node.name: PROCESSORS[(i // size) % 2] for i, node in enumerate(graph.nodes)}


def _shapes(case: Case) -> dict[str, tuple[int, ...]]:
    """The test's input shapes, as ``--input-shape`` gives them (tensors only)."""
    return {name: tuple(v.shape) for name, v in case.feeds().items() if isinstance(v, np.ndarray)}


def _load_and_partition(case: Case, path: Path, runs: int, stage: list[str], values: bool):
    from edgesplit.model.load import load_model
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.workflows.resolve import partition

    stage[0] = "load"
    graph = load_model(path, _shapes(case), input_values=case.feeds() if values else None)
    stage[0] = "partition"
    profiling = ProfileOptions(runs=runs, warmup=0)
    return graph, partition(graph, DEVICE, pins=pins_for(graph), profiling=profiling)


@dataclass(frozen=True)
class Outcome:
    """What edgesplit did with a case: ``stage`` ``"pass"`` or the stage that failed, and why; the
    plan's parts, and the op types of the nodes that read or write a tensor crossing a part
    boundary."""

    stage: str
    reason: str = ""
    parts: int = 0
    crossing: tuple[str, ...] = ()


def boundary_ops(graph, plan) -> tuple[str, ...]:
    """Op types of the nodes that write a tensor another part reads, or read one another part
    wrote."""
    part_of = {n: k for k, p in enumerate(plan.parts) for n in p.nodes}
    ops = set()
    for d_node in graph.nodes:
        for t in d_node.inputs:
            src = graph.producer.get(t)
            if src is not None and part_of.get(graph.nodes[src].name) != part_of.get(d_node.name):
                ops.update((graph.nodes[src].op_type, d_node.op_type))
    return tuple(sorted(ops))


def run_edgesplit(case: Case, workdir: Path, runs: int = 1) -> Outcome:
    """Load, profile, partition, compile and run ``case``, and compare its outputs.

    The inputs' values are given (``--input``) only when edgesplit asks for them: an input whose
    values decide shapes, a sequence, or one that made-up values do not fill."""
    from edgesplit.runtime.session import load
    from edgesplit.workflows.compile import compile_bundle

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "model.onnx"
    onnx.save(case.model, path)
    stage = ["load"]
    plan = None
    try:
        try:
            graph, plan = _load_and_partition(case, path, runs, stage, values=False)
        except Exception as e:  # noqa: BLE001
            if "--input" not in str(e):
                raise
            graph, plan = _load_and_partition(case, path, runs, stage, values=True)
        stage[0] = "compile"
        compile_bundle(graph, plan, workdir / "bundle", force=True)
        stage[0] = "run"
        with load(workdir / "bundle") as sess:
            out = sess.run(case.feeds())
        got = [out[o] for o in graph.outputs]
        stage[0] = "compare"
        assert_similar(case, got)
    except Exception as e:  # noqa: BLE001
        return Outcome(stage[0], first_line(e), len(plan.parts) if plan else 0)
    return Outcome("pass", "", len(plan.parts), boundary_ops(graph, plan))


KNOWN_FAILURES = Path(__file__).with_name("conformance_known_failures.txt")


def known_failures(path: Path = KNOWN_FAILURES) -> dict[str, tuple[str, str]]:
    """``folder/case -> (stage, reason)`` from the known-failures file: one line per model,
    ``folder/case  stage  reason``; ``#`` starts a comment.

    Raises:
        ValueError: a line that is not of that form, names an unknown stage, or a model twice.
    """
    out: dict[str, tuple[str, str]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or "/" not in parts[0] or parts[1] not in STAGES or parts[0] in out:
            raise ValueError(
                f"{path}:{n}: not 'folder/case stage reason' (stages: {', '.join(STAGES)}): {line}"
            )
        out[parts[0]] = (parts[1], parts[2])
    return out


def sample(all_cases: Sequence[Case], n: int, seed: int) -> list[Case]:
    """A fixed, seeded sample of ``n`` cases."""
    rng = random.Random(seed)
    return sorted(rng.sample(list(all_cases), min(n, len(all_cases))), key=lambda c: c.key)


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    box = [0.0]
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - t0


os.environ.setdefault("ORT_LOGGING_LEVEL", "4")
