"""``compile``: turn a model and its plan into a bundle of per-device artifacts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import onnx

from edgesplit.compile.bundle import Manifest, PartArtifact, TensorSpec, checksums, write_manifest
from edgesplit.compile.split import check_parts, extract_parts, rel_error
from edgesplit.compile.tvm_build import build_library, runs_here
from edgesplit.device import DeviceSpec, load_device
from edgesplit.errors import CompileError, PlanError
from edgesplit.model.graph import ModelGraph
from edgesplit.model.load import load_model
from edgesplit.util import atomic_dir, read_json_object, sha256_file

Progress = Callable[[str, int, int], None]


def plan_dict(plan: Any) -> dict[str, Any]:
    """A plan as a JSON dict, from a Plan object, a dict, or a path to plan.json."""
    if isinstance(plan, Mapping):
        return dict(plan)
    if hasattr(plan, "to_json"):
        return plan.to_json()
    if is_dataclass(plan):
        return asdict(plan)
    data = read_json_object(plan, PlanError, "plan")
    if "parts" not in data:
        raise PlanError(f"{plan}: not a plan (no parts)")
    return data


def _spec(graph: ModelGraph, name: str) -> TensorSpec:
    t = graph.tensors[name]
    return TensorSpec(name, t.shape, t.dtype)


def _device_for(plan: Mapping[str, Any], device: DeviceSpec | str | None) -> DeviceSpec:
    spec = device if isinstance(device, DeviceSpec) else load_device(device or plan["device"])
    server = plan.get("server")
    if server and not any(p.is_remote for p in spec.processors):
        spec = spec.with_server(load_device(server))
    return spec


def compile_bundle(
    model: str | os.PathLike | ModelGraph,
    plan: Any,
    out: str | os.PathLike,
    *,
    device: DeviceSpec | str | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    tune_trials: int = 0,
    progress: Progress | None = None,
) -> Manifest:
    """Extract, check and compile every part of ``plan``; write the bundle at ``out`` atomically.

    Raises:
        PlanError: the plan was made for another model, or names unknown processors.
        CompileError: a part cannot be extracted, does not match the whole model, or its target
            needs a toolchain that is missing.
    """
    pd = plan_dict(plan)
    shapes = input_shapes or {k: tuple(v) for k, v in (pd.get("input_shapes") or {}).items()}
    if not isinstance(model, ModelGraph) and Path(model).is_file():
        _check_plan_fits(pd, str(model), sha256_file(model))  # before the plan's shapes are applied
    graph = model if isinstance(model, ModelGraph) else load_model(model, shapes or None)
    _check_plan_fits(pd, graph.path, graph.sha256)
    spec = _device_for(pd, device)
    parts_pd = pd["parts"]
    known = set(graph.index)
    for p in parts_pd:
        spec.processor(p["processor"])
        bad = [n for n in p["nodes"] if n not in known]
        if bad:
            raise PlanError(f"plan part {p['name']} names nodes the model lacks: {', '.join(bad[:5])}")
    extracted = extract_parts(graph, [(p["name"], p["inputs"], p["outputs"]) for p in parts_pd])
    errors = check_parts(graph, extracted)
    producer = {t: p["name"] for p in parts_pd for t in p["outputs"]}
    local_cpu = next((p for p in spec.processors if not p.is_remote and p.kind == "cpu"), None)
    notes: list[str] = []
    artifacts: list[PartArtifact] = []
    with atomic_dir(out) as tmp:
        (tmp / "parts").mkdir()
        for k, (p, pm) in enumerate(zip(parts_pd, extracted)):
            if progress:
                progress("compile", k, len(parts_pd))
            proc = spec.processor(p["processor"])
            onnx_rel = f"parts/{p['name']}.onnx"
            onnx.save(pm.model, tmp / onnx_rel)
            backend = p.get("backend", "ort")
            file_rel, fallback, note, target = (
                onnx_rel,
                None,
                f"max rel error vs whole model {errors[p['name']]:.1e}",
                None,
            )
            provider, options = "CPUExecutionProvider", {}
            if backend == "ort":
                b = proc.backend("ort")
                provider, options = b.provider, dict(b.options)
            elif backend == "tvm":
                target = dict(proc.backend("tvm").target or {"kind": "llvm"})
                file_rel = f"parts/{p['name']}.so"
                try:
                    t0 = time.perf_counter()
                    build_library(pm.model, target, tmp / file_rel, tune_trials=tune_trials)
                    note = f"tvm build {time.perf_counter() - t0:.1f}s"
                    if runs_here(target):
                        note += f"; max rel error vs ORT {_check_tvm(tmp / file_rel, pm, graph):.1e}"
                except CompileError:
                    raise
                except Exception as e:  # noqa: BLE001 - TVM import/build failures fall back to ORT
                    reason = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
                    notes.append(f"part {p['name']}: TVM failed ({reason}); runs on ORT instead")
                    (tmp / file_rel).unlink(missing_ok=True)
                    backend, file_rel, note = "ort", onnx_rel, f"TVM failed: {reason}"
            if p.get("remote") or proc.is_remote:
                if local_cpu is not None:
                    fallback = {
                        "backend": "ort",
                        "file": onnx_rel,
                        "processor": local_cpu.name,
                        "reason": "runs locally when the server is unreachable or too slow",
                    }
            artifacts.append(
                PartArtifact(
                    name=p["name"],
                    processor=proc.name,
                    backend=backend,
                    file=file_rel,
                    onnx_file=onnx_rel,
                    inputs=tuple(_spec(graph, t) for t in pm.inputs),
                    outputs=tuple(_spec(graph, t) for t in pm.outputs),
                    depends_on=tuple(sorted({producer[t] for t in pm.inputs if t in producer})),
                    remote=bool(p.get("remote") or proc.is_remote),
                    provider=provider,
                    provider_options=options,
                    target=target,
                    threads=proc.threads or (len(proc.cores) if proc.cores else None),
                    cores=proc.cores,
                    cpu_quota_pct=proc.cpu_quota_pct,
                    fallback=fallback,
                    predicted_ms=p.get("latency_ms"),
                    note=note,
                )
            )
        files = [f for a in artifacts for f in {a.file, a.onnx_file}]
        manifest = Manifest(
            model_sha256=graph.sha256,
            model_name=graph.name,
            device=pd.get("device", spec.name),
            inputs=tuple(_spec(graph, t) for t in graph.inputs),
            outputs=tuple(_spec(graph, t) for t in graph.outputs),
            parts=tuple(artifacts),
            files=checksums(tmp, files),
            plan=pd,
            server=pd.get("server"),
            notes=tuple(notes),
        )
        write_manifest(tmp, manifest)
    if progress:
        progress("compile", len(parts_pd), len(parts_pd))
    return manifest


def _check_plan_fits(pd: Mapping[str, Any], path: str, sha256: str) -> None:
    if pd.get("model_sha256") != sha256:
        raise PlanError(
            f"plan for model {pd.get('model_name')!r} (sha256 {str(pd.get('model_sha256'))[:12]}...) does not "
            f"fit {path} (sha256 {sha256[:12]}...)"
        )


def _check_tvm(lib: Path, pm, graph: ModelGraph) -> float:
    """Run the built library on the part's reference inputs; it must match ORT within 1e-4."""
    import numpy as np
    import onnxruntime as ort

    from edgesplit.model.feeds import random_tensor
    from edgesplit.runtime.executors import TvmExecutor

    rng = np.random.default_rng(0)
    feeds = {t: random_tensor(graph.tensors[t], rng) for t in pm.inputs}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(pm.model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        list(pm.outputs), feeds
    )
    import shutil
    import tempfile

    # Load a private copy: the library stays mapped in this process until exit, and the bundle's
    # own file must stay free to be moved, replaced or (in tests) tampered with.
    with tempfile.TemporaryDirectory(prefix="edgesplit-tvm-check-") as tmp:
        shutil.copyfile(lib, Path(tmp) / lib.name)
        part = PartArtifact(
            name=pm.name,
            processor="",
            backend="tvm",
            file=lib.name,
            onnx_file="",
            inputs=tuple(_spec(graph, t) for t in pm.inputs),
            outputs=tuple(_spec(graph, t) for t in pm.outputs),
        )
        got = TvmExecutor(part, Path(tmp)).run(feeds)
    worst = max(rel_error(got[t], w) for t, w in zip(pm.outputs, want))
    if worst > 1e-4:
        raise RuntimeError(f"TVM output differs from ORT (rel error {worst:.1e})")
    return worst
