"""Export a bundle's server parts as a Triton Inference Server model repository.

Layout (Triton's): ``REPO/<part>/config.pbtxt`` (``platform: "onnxruntime_onnx"``, backend
``onnxruntime``, inputs and outputs with data types and dims, ``max_batch_size: 0`` because the
part's shapes already hold the batch dimension) and ``REPO/<part>/1/model.onnx``. Where server
parts feed each other, an ``ensemble`` model chains them so one request runs the whole server
side (one ensemble per connected group of server parts: ``ensemble``, or ``ensemble_<k>`` when
there are several). The model names are the part names, as with ``edgesplit serve``, so the
remote executor talks to a Triton fleet unchanged.

With ``max_batch > 1`` (``export-triton --max-batch N --max-queue-delay-ms D``, the settings of
``serve``), each part that has a batch-free form (:func:`edgesplit.bundle.batching.free_batch`,
checked by running it) is written in that form with ``max_batch_size: N x rows`` (rows: the
part's own first dimension), dims without the batch dimension, and ``dynamic_batching {
max_queue_delay_microseconds: D x 1000 }``. The others keep ``max_batch_size: 0``, and so do all
parts of an ensemble that holds one of them (an ensemble batches only when all its steps do);
:attr:`TritonExport.unbatched` says which and why.

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

from edgesplit.bundle.format import (
    Manifest,
    PartArtifact,
    TensorSpec,
    VerifiedBundle,
    open_verified,
)
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
    unbatched: tuple[tuple[str, str], ...] = ()  # (part, why) when batching was asked for
    # (part, backend) for a part whose own artifact (a TVM library, an int8 or fp16 model) is not
    # what Triton runs: the repository holds its fp32 ONNX file, for Triton's ONNX Runtime backend
    as_onnx: tuple[tuple[str, str], ...] = ()


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


@dataclass(frozen=True)
class Batching:
    """Triton's batching of one model: ``max_batch_size`` rows (0: none) and the queue delay."""

    max_batch_size: int = 0
    max_queue_delay_us: int = 0


def _tensor(pb: ModuleType, kind: str, t: TensorSpec, part: str, batched: bool = False) -> Any:
    if t.dtype not in TRITON_TYPES:
        raise CompileError(
            f"part {part}: tensor '{t.name}' has dtype {t.dtype}, which Triton cannot carry"
        )
    cls = pb.ModelInput if kind == "input" else pb.ModelOutput
    dims = list(t.shape[1:] if batched else t.shape)  # a batching model's dims leave out the batch
    return cls(name=t.name, data_type=pb.DataType.Value(TRITON_TYPES[t.dtype]), dims=dims)


def _batching_fields(pb: ModuleType, batching: Batching) -> dict[str, Any]:
    if not batching.max_batch_size:
        return {"max_batch_size": 0}
    return {
        "max_batch_size": batching.max_batch_size,
        "dynamic_batching": pb.ModelDynamicBatching(
            max_queue_delay_microseconds=batching.max_queue_delay_us
        ),
    }


def part_config(pb: ModuleType, part: PartArtifact, batching: Batching = Batching()) -> Any:
    """The ``ModelConfig`` of one server part (ONNX Runtime backend)."""
    gpu = "CUDA" in part.provider or "Tensorrt" in part.provider
    kind = pb.ModelInstanceGroup.Kind.Value("KIND_GPU" if gpu else "KIND_CPU")
    b = batching.max_batch_size > 0
    return pb.ModelConfig(
        name=part.name,
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        input=[_tensor(pb, "input", t, part.name, b) for t in part.inputs],
        output=[_tensor(pb, "output", t, part.name, b) for t in part.outputs],
        instance_group=[pb.ModelInstanceGroup(kind=kind, count=1)],
        **_batching_fields(pb, batching),
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


def ensemble_config(
    pb: ModuleType,
    name: str,
    group: list[PartArtifact],
    manifest: Manifest,
    max_batch_size: int = 0,
) -> Any:
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
    b = max_batch_size > 0
    return pb.ModelConfig(
        name=name,
        platform="ensemble",
        max_batch_size=max_batch_size,
        input=[_tensor(pb, "input", t, name, b) for t in inputs.values()],
        output=[_tensor(pb, "output", t, name, b) for t in outputs],
        ensemble_scheduling=pb.ModelEnsembling(step=steps),
    )


def _checked_text(pb: ModuleType, config: Any) -> str:
    """The config in text format, parsed back with Triton's schema (raises on any mismatch)."""
    from google.protobuf import text_format

    text = text_format.MessageToString(config)
    try:
        parsed = text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as e:
        raise CompileError(
            f"config of {config.name} does not parse as a Triton ModelConfig ({e})"
        ) from e
    if parsed != config:
        raise CompileError(f"config of {config.name} does not survive a text round trip")
    return text


def config_text(pb: ModuleType, config: Any) -> str:
    """A ``ModelConfig`` in text format, checked by parsing it back with Triton's schema.

    Raises:
        CompileError: the text does not parse as a ``ModelConfig``, or parses to another config.
    """
    return _checked_text(pb, config)


def _batch_forms(
    verified: VerifiedBundle,
    parts: list[PartArtifact],
    groups: list[list[PartArtifact]],
    max_batch: int,
) -> tuple[dict[str, tuple[bytes, int]], list[tuple[str, str]]]:
    """Per batchable part its batch-free ONNX and rows; and the unbatched parts with the reason."""
    if max_batch <= 1:
        return {}, []
    from edgesplit.bundle.batching import free_batch

    forms: dict[str, tuple[bytes, int]] = {}
    unbatched: list[tuple[str, str]] = []
    for p in parts:
        found = free_batch(verified.read(p.onnx_file), p.inputs, p.outputs)
        if found.onnx_bytes is not None:
            forms[p.name] = (found.onnx_bytes, found.rows)
        else:
            unbatched.append((p.name, found.reason))
    for group in groups:  # an ensemble batches only when every step does, with the same rows
        rows = {forms[p.name][1] if p.name in forms else 0 for p in group}
        if len(rows) > 1 or 0 in rows:
            for p in group:
                if forms.pop(p.name, None) is not None:
                    unbatched.append((p.name, "in an ensemble with a part that cannot batch"))
    return forms, unbatched


def export_triton(
    bundle: str | os.PathLike,
    repo: str | os.PathLike,
    *,
    all_parts: bool = False,
    max_batch: int = 1,
    max_queue_delay_ms: float = 0.0,
) -> TritonExport:
    """Write a Triton model repository for the bundle's server parts (every part with
    ``all_parts``).

    The bundle is verified first; the repository appears only when complete (an existing one at
    ``repo`` is replaced). With ``max_batch > 1`` the parts that can batch get Triton's dynamic
    batching (see the module doc).

    Raises:
        BundleError: for a corrupt bundle, or one without server parts.
        CompileError: for a part whose tensors Triton cannot carry, or a config Triton's schema
        rejects.
    """
    root = Path(bundle)
    verified = open_verified(root)
    manifest = verified.manifest
    parts = [p for p in manifest.parts if p.remote or all_parts]
    if not parts:
        raise BundleError(
            f"{root}: no server parts (remote=True) to export; use --all-parts for every part"
        )
    bad = [p.name for p in parts if not _NAME.match(p.name)]
    if bad:
        raise CompileError(f"part names unfit for Triton model directories: {', '.join(bad)}")
    if max_batch < 1 or not 0 <= max_queue_delay_ms < 60_000:
        raise CompileError(
            f"max_batch must be >= 1 and the queue delay 0 to 60000 ms ({max_batch}, "
            f"{max_queue_delay_ms})"
        )
    pb = model_config_pb2()
    groups = _groups(parts)
    forms, unbatched = _batch_forms(verified, parts, groups, max_batch)
    delay_us = round(max_queue_delay_ms * 1e3)
    configs = [
        part_config(
            pb,
            p,
            Batching(max_batch * forms[p.name][1], delay_us) if p.name in forms else Batching(),
        )
        for p in parts
    ]
    names = ["ensemble"] if len(groups) == 1 else [f"ensemble_{k}" for k in range(len(groups))]
    taken = {p.name for p in parts}
    ensembles = []
    for name, group in zip(names, groups):
        while name in taken:
            name = f"{name}_"
        taken.add(name)
        rows = max_batch * forms[group[0].name][1] if group[0].name in forms else 0
        ensembles.append(ensemble_config(pb, name, group, manifest, rows))
    with atomic_dir(repo) as tmp:
        for part, config in zip(parts, configs):
            (tmp / part.name / "1").mkdir(parents=True)
            # the bytes checked as they are read (or their batch-free form), not the file again by
            # path
            data = forms[part.name][0] if part.name in forms else verified.read(part.onnx_file)
            (tmp / part.name / "1" / "model.onnx").write_bytes(data)
            (tmp / part.name / "config.pbtxt").write_text(_checked_text(pb, config))
        for config in ensembles:
            (tmp / config.name / "1").mkdir(
                parents=True
            )  # Triton wants a version folder, even empty
            (tmp / config.name / "config.pbtxt").write_text(_checked_text(pb, config))
    return TritonExport(
        Path(repo),
        tuple(p.name for p in parts),
        tuple(c.name for c in ensembles),
        tuple(unbatched),
        tuple((p.name, p.backend) for p in parts if p.file != p.onnx_file),
    )
