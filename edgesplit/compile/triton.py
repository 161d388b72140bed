"""Export a bundle's server parts as a Triton Inference Server model repository.

Layout (Triton's): ``REPO/<part>/config.pbtxt`` (``platform: "onnxruntime_onnx"``, backend
``onnxruntime``, inputs and outputs with data types and dims, ``max_batch_size: 0`` because the
part's shapes already hold the batch dimension) and ``REPO/<part>/1/model.onnx``. Where server
parts feed each other, an ``ensemble`` model chains them so one request runs the whole server
side (one ensemble per connected group of server parts: ``ensemble``, or ``ensemble_<k>`` when
there are several). The model names are the part names, as with ``edgesplit serve``, so the
remote executor talks to a Triton fleet unchanged.

Every config is built as Triton's own ``ModelConfig`` protobuf (the schema shipped inside
``tritonclient``), written in text format, and parsed back before the repository is put in place.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from edgesplit.compile.bundle import Manifest, PartArtifact, TensorSpec, open_verified
from edgesplit.errors import BundleError, CompileError
from edgesplit.util import atomic_dir

TRITON_TYPES: dict[str, str] = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class TritonExport:
    """What was written: the repository and its models (parts first, then ensembles)."""

    repo: Path
    models: tuple[str, ...]
    ensembles: tuple[str, ...]


def model_config_pb2() -> ModuleType:
    """Triton's ``model_config_pb2``, loaded from the tritonclient wheel.

    ``tritonclient.grpc/__init__`` refuses to import without grpc, so the generated module is
    loaded from its file; it needs only protobuf.
    """
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        raise CompileError(
            "export-triton needs tritonclient (pip install 'tritonclient[http]') for "
            "Triton's ModelConfig schema"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    if not path.is_file():
        raise CompileError(f"{path}: Triton's ModelConfig schema is missing from tritonclient")
    mspec = importlib.util.spec_from_file_location("_edgesplit_triton_model_config_pb2", path)
    assert mspec is not None and mspec.loader is not None
    module = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(module)
    return module


def _tensor(pb: ModuleType, kind: str, t: TensorSpec, part: str) -> Any:
    if t.dtype not in TRITON_TYPES:
        raise CompileError(f"part {part}: tensor '{t.name}' has dtype {t.dtype}, which Triton cannot carry")
    cls = pb.ModelInput if kind == "input" else pb.ModelOutput
    return cls(name=t.name, data_type=pb.DataType.Value(TRITON_TYPES[t.dtype]), dims=list(t.shape))


def part_config(pb: ModuleType, part: PartArtifact) -> Any:
    """The ``ModelConfig`` of one server part (ONNX Runtime backend)."""
    gpu = "CUDA" in part.provider or "Tensorrt" in part.provider
    kind = pb.ModelInstanceGroup.Kind.Value("KIND_GPU" if gpu else "KIND_CPU")
    return pb.ModelConfig(
        name=part.name,
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        max_batch_size=0,
        input=[_tensor(pb, "input", t, part.name) for t in part.inputs],
        output=[_tensor(pb, "output", t, part.name) for t in part.outputs],
        instance_group=[pb.ModelInstanceGroup(kind=kind, count=1)],
    )


def _groups(parts: list[PartArtifact]) -> list[list[PartArtifact]]:
    """Connected groups (through depends_on) of the server parts, in bundle order."""
    names = {p.name for p in parts}
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for p in parts:
        for d in p.depends_on:
            if d in names:
                parent[find(p.name)] = find(d)
    groups: dict[str, list[PartArtifact]] = {}
    for p in parts:
        groups.setdefault(find(p.name), []).append(p)
    return [g for g in groups.values() if len(g) > 1]


def ensemble_config(pb: ModuleType, name: str, group: list[PartArtifact], manifest: Manifest) -> Any:
    """An ensemble that runs ``group`` (server parts that feed each other) as one model."""
    members = {p.name for p in group}
    produced = {t.name: t for p in group for t in p.outputs}
    read_outside = {t.name for p in manifest.parts if p.name not in members for t in p.inputs}
    read_outside |= {t.name for t in manifest.outputs}
    inputs: dict[str, TensorSpec] = {}
    for p in group:
        for t in p.inputs:
            if t.name not in produced:
                inputs.setdefault(t.name, t)
    outputs = [t for t in produced.values() if t.name in read_outside]
    if not outputs:  # nothing leaves the group: answer what its last part produces
        outputs = list(group[-1].outputs)
    steps = [
        pb.ModelEnsembling.Step(
            model_name=p.name,
            model_version=-1,
            input_map={t.name: t.name for t in p.inputs},
            output_map={t.name: t.name for t in p.outputs},
        )
        for p in group
    ]
    return pb.ModelConfig(
        name=name,
        platform="ensemble",
        max_batch_size=0,
        input=[_tensor(pb, "input", t, name) for t in inputs.values()],
        output=[_tensor(pb, "output", t, name) for t in outputs],
        ensemble_scheduling=pb.ModelEnsembling(step=steps),
    )


def _checked_text(pb: ModuleType, config: Any) -> str:
    """The config in text format, parsed back with Triton's schema (raises on any mismatch)."""
    from google.protobuf import text_format

    text = text_format.MessageToString(config)
    try:
        parsed = text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as e:
        raise CompileError(f"config of {config.name} does not parse as a Triton ModelConfig ({e})") from e
    if parsed != config:
        raise CompileError(f"config of {config.name} does not survive a text round trip")
    return text


def export_triton(
    bundle: str | os.PathLike, repo: str | os.PathLike, *, all_parts: bool = False
) -> TritonExport:
    """Write a Triton model repository for the bundle's server parts (every part with ``all_parts``).

    The bundle is verified first; the repository appears only when complete (an existing one at
    ``repo`` is replaced).

    Raises:
        BundleError: for a corrupt bundle, or one without server parts.
        CompileError: for a part whose tensors Triton cannot carry, or a config Triton's schema rejects.
    """
    root = Path(bundle)
    verified = open_verified(root)
    manifest = verified.manifest
    parts = [p for p in manifest.parts if p.remote or all_parts]
    if not parts:
        raise BundleError(f"{root}: no server parts (remote=True) to export; use --all-parts for every part")
    bad = [p.name for p in parts if not _NAME.match(p.name)]
    if bad:
        raise CompileError(f"part names unfit for Triton model directories: {', '.join(bad)}")
    pb = model_config_pb2()
    configs = [part_config(pb, p) for p in parts]
    groups = _groups(parts)
    names = ["ensemble"] if len(groups) == 1 else [f"ensemble_{k}" for k in range(len(groups))]
    taken = {p.name for p in parts}
    ensembles = []
    for name, group in zip(names, groups):
        while name in taken:
            name = f"{name}_"
        taken.add(name)
        ensembles.append(ensemble_config(pb, name, group, manifest))
    with atomic_dir(repo) as tmp:
        for part, config in zip(parts, configs):
            (tmp / part.name / "1").mkdir(parents=True)
            # the bytes checked as they are read, not the file again by path
            (tmp / part.name / "1" / "model.onnx").write_bytes(verified.read(part.onnx_file))
            (tmp / part.name / "config.pbtxt").write_text(_checked_text(pb, config))
        for config in ensembles:
            (tmp / config.name / "1").mkdir(parents=True)  # Triton wants a version folder, even empty
            (tmp / config.name / "config.pbtxt").write_text(_checked_text(pb, config))
    return TritonExport(Path(repo), tuple(p.name for p in parts), tuple(c.name for c in ensembles))
