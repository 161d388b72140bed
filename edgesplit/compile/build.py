"""``compile``: turn a model and its plan into a bundle of per-device artifacts.

Every part is extracted and checked against the whole model (:mod:`edgesplit.compile.split`),
then compiled by its backend's entry in :data:`edgesplit.compile.backends.COMPILERS`. A plan with
int8 or fp16 parts is then checked as it ships, against the plan's accuracy budget
(:mod:`edgesplit.compile.precision_check`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

import onnx

from edgesplit.backends.tvm.tune import TuneOptions
from edgesplit.bundle.format import (
    BundleBands,
    Manifest,
    PartArtifact,
    TensorSpec,
    checksums,
    is_bundle_dir,
    write_manifest,
)
from edgesplit.bundle.signing import load_private_key
from edgesplit.compile.backends import COMPILERS
from edgesplit.compile.bands import bundle_bands, compile_band_parts, part_key
from edgesplit.compile.dynamic import DynamicPart, dynamic_part
from edgesplit.compile.job import BuildSettings, CompileJob
from edgesplit.compile.precision_check import check_precision, plan_budget, require
from edgesplit.compile.split import PartModel, check_parts, extract_parts
from edgesplit.device.spec import DeviceSpec, Processor
from edgesplit.errors import BundleError, CompileError, PlanError
from edgesplit.limits import stage_limit
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.accuracy import backend_precision
from edgesplit.optimize.bands import BandAnalysis
from edgesplit.optimize.plan import Part, Plan, check_plan, check_plan_types
from edgesplit.precision import recorded_calibration
from edgesplit.util import Progress, atomic_dir, refuse_to_replace, short

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edgesplit.precision.metrics import AccuracyBudget


def _spec(graph: ModelGraph, name: str, dynamic: DynamicPart | None = None) -> TensorSpec:
    t = graph.tensors[name]
    axes = dynamic.dynamic_axes.get(name, ()) if dynamic is not None else ()
    return TensorSpec(name, t.shape, t.dtype, t.kind, axes)


def check_plan_fits(plan: Plan, path: str, sha256: str) -> None:
    if plan.model_sha256 != sha256:
        raise PlanError(
            f"plan for model {plan.model_name!r} (sha256 {plan.model_sha256[:12]}...) does not "
            f"fit {path} (sha256 {sha256[:12]}...)"
        )


def _check_known(plan: Plan, graph: ModelGraph, spec: DeviceSpec, source: str) -> None:
    """The parts fit the model and the device: names, processors, nodes (each in exactly one part)
    and the tensors each part reads and writes."""
    if source == "plan":  # made in Python: not checked by load_plan
        check_plan_types(plan, source)
    check_plan(plan, source)
    procs = set(spec.processor_names)
    for p in plan.parts:
        if p.processor not in procs:
            raise PlanError(
                f"{source}: part {p.name} runs on processor {short(p.processor, 40)}, which "
                f"{spec.path or spec.name} "
                f"lacks (processors: {', '.join(sorted(procs))})"
            )
        runs = backend_precision(spec, p.processor, p.backend)
        if p.precision != runs:  # the manifest, and the Android app's executor table, trust it
            raise PlanError(
                f"{source}: part {p.name} says {short(p.precision, 20)}, but {p.backend} on "
                f"{p.processor} runs {runs}"
            )
        bad = [short(n, 40) for n in p.nodes if n not in graph.index]
        if bad:
            raise PlanError(
                f"{source}: part {p.name} names nodes the model lacks: {', '.join(bad[:5])}"
            )
        bad = [short(t, 40) for t in (*p.inputs, *p.outputs) if t not in graph.tensors]
        if bad:
            raise PlanError(
                f"{source}: part {p.name} names tensors the model lacks: {', '.join(bad[:5])}"
            )
        made = {t for n in p.nodes for t in graph.nodes[graph.index[n]].outputs}
        bad = [short(t, 40) for t in p.outputs if t not in made]
        if bad:
            raise PlanError(
                f"{source}: part {p.name} lists outputs its nodes do not write: "
                f"{', '.join(bad[:5])}"
            )
    for q in plan.replicas:
        if q not in procs:
            raise PlanError(
                f"{source}: replicas: processor {short(q, 40)} is not one of "
                f"{spec.path or spec.name}'s"
            )
    placed = {n for p in plan.parts for n in p.nodes}
    missing = [short(nd.name, 40) for nd in graph.nodes if nd.name not in placed]
    if missing:
        raise PlanError(
            f"{source}: {len(missing)} node(s) of the model are in no part: "
            f"{', '.join(missing[:5])}"
        )


def check_output(out: str | os.PathLike, force: bool, inputs: Sequence[str]) -> None:
    """``-o`` replaces only an empty folder or a bundle, unless ``force``; never one holding an
    input."""
    target = Path(out).resolve()
    for f in inputs:
        if f and (target == Path(f).resolve() or target in Path(f).resolve().parents):
            raise PlanError(f"{out}: the output would replace {f}, one of the inputs")
    refuse_to_replace(
        out, force=force, ours=is_bundle_dir, what="an edgesplit bundle", error=BundleError
    )


class CompileOptions(TypedDict, total=False):
    """How :func:`build_bundle` compiles (every key optional)."""

    tune_trials: int
    """TVM tuning first: trials in all (default 0: tuning databases apply anyway)."""
    tune: TuneOptions | None
    """TVM tuning first, with these options."""
    progress: Progress | None
    force: bool
    """Replace ``out`` even when it is neither empty nor an edgesplit bundle."""
    sign_key: str | os.PathLike | Ed25519PrivateKey | None
    """An ed25519 private key (file or key) to sign the manifest with (``bundle.signing``)."""
    accuracy_budget: AccuracyBudget | None
    """What int8/fp16 parts must meet, measured as shipped (default the plan's)."""
    check_accuracy: bool
    """False: not measured here (``deploy``'s verification measures them itself)."""


def build_bundle(
    graph: ModelGraph,
    plan: Plan,
    spec: DeviceSpec,
    out: str | os.PathLike,
    *,
    source: str = "plan",
    bands: BandAnalysis | None = None,
    **options: Unpack[CompileOptions],
) -> Manifest:
    """Extract, check and compile every part of ``plan``; write the bundle at ``out`` atomically.

    Args:
        graph: The model, loaded with the plan's shapes (and rewritten for its split operators).
        plan: The plan, for ``graph`` on ``spec``.
        spec: The device, with its server's processors.
        source: Where the plan came from, for messages (its file, or ``"plan"``).
        bands: With a server, the band analysis of the plan
        (:func:`edgesplit.optimize.bands.band_analysis`):
            a plan per bandwidth band is compiled too (an adaptive bundle, ``BundleBands``, parts
            shared
            by plans stored once); an analysis without a table leaves a note saying why.

    Raises:
        PlanError: the plan was made for another model, or names unknown processors or nodes.
        CompileError: a part cannot be extracted, does not match the whole model, its backend has
            no compiler, its target needs a missing toolchain; int8/fp16 parts miss the budget.
    """
    force = options.get("force", False)
    progress = options.get("progress")
    sign_key = options.get("sign_key")
    key = load_private_key(sign_key) if sign_key is not None else None
    check_plan_fits(plan, graph.path, graph.sha256)
    check_output(out, force, [graph.path, "" if source == "plan" else source])
    _check_known(plan, graph, spec, source)
    local_cpu = next((p for p in spec.processors if not p.is_remote and p.kind == "cpu"), None)
    notes: list[str] = []
    analysis = bands
    if analysis is not None and analysis.table is None and plan.server:
        notes.append(f"no band table: {analysis.reason}")
    tune_trials, tune = options.get("tune_trials", 0), options.get("tune")
    accuracy_budget, check_accuracy = (
        options.get("accuracy_budget"),
        options.get("check_accuracy", True),
    )
    with stage_limit("compile", graph.path), atomic_dir(out) as tmp:  # edgesplit.limits
        (tmp / "parts").mkdir()
        data, method = recorded_calibration(plan.accuracy)
        settings = BuildSettings(tune_trials, tune, data, method, progress)
        dynamic = dynamic_part(graph, plan)
        artifacts = _compile_plan_parts(graph, tmp, plan, spec, local_cpu, settings, notes, dynamic)
        replicas = _replicas(plan, spec, artifacts)
        band_set = None
        if analysis is not None and analysis.table is not None:
            band_set = _compile_bands(
                graph, tmp, plan, analysis, spec, local_cpu, settings, artifacts, notes
            )
        notes += _check_precision(
            graph, tmp, plan, band_set, artifacts, accuracy_budget, check_accuracy
        )
        manifest = Manifest(
            model_sha256=graph.sha256,
            model_name=graph.name,
            device=plan.device or spec.name,
            inputs=tuple(_spec(graph, t, dynamic) for t in graph.inputs),
            outputs=tuple(_spec(graph, t, dynamic) for t in graph.outputs),
            parts=tuple(artifacts),
            files=checksums(tmp, [f for a in artifacts for f in {a.file, a.onnx_file}]),
            plan=plan,
            server=plan.server,
            notes=tuple(notes),
            bands=band_set,
            replicas=tuple((a.name,) for a in replicas),
        )
        write_manifest(tmp, manifest, key)
    if progress:
        progress("compile", len(plan.parts), len(plan.parts))
    return manifest


def _compile_plan_parts(
    graph: ModelGraph,
    tmp: Path,
    plan: Plan,
    spec: DeviceSpec,
    local_cpu: Processor | None,
    settings: BuildSettings,
    notes: list[str],
    dynamic: DynamicPart | None = None,
) -> list[PartArtifact]:
    """Extract, check and compile the plan's own parts into ``tmp``; warnings go to ``notes``.
    With ``dynamic`` (:func:`edgesplit.compile.dynamic.dynamic_part`), the one part is that
    model, its dynamic axes kept."""
    extracted = extract_parts(graph, [(p.name, p.inputs, p.outputs) for p in plan.parts])
    if dynamic is not None:
        (pm,) = extracted
        extracted = [replace(pm, model=dynamic.model)]
        notes.append(
            f"part {pm.name} keeps the model's dynamic axes "
            f"({', '.join(f'{k} {list(v)}' for k, v in list(dynamic.dynamic_axes.items())[:2])}"
            f"{', ...' if len(dynamic.dynamic_axes) > 2 else ''})"
        )
    errors = check_parts(
        graph, extracted, reduced={p.name for p in plan.parts if p.precision != "fp32"}
    )
    producer = {t: p.name for p in plan.parts for t in p.outputs}
    artifacts: list[PartArtifact] = []
    for k, (p, pm) in enumerate(zip(plan.parts, extracted)):
        if settings.progress:
            settings.progress("compile", k, len(plan.parts))
        job = CompileJob(pm, graph, tmp, f"parts/{p.name}.onnx", errors[p.name], settings)
        onnx.save(pm.model, tmp / job.onnx_file)
        art, warning = _compile_part(
            job, p, spec.processor(p.processor), local_cpu, producer, dynamic
        )
        artifacts.append(art)
        notes.extend([warning] if warning else [])
    return artifacts


def _replicas(plan: Plan, spec: DeviceSpec, artifacts: list[PartArtifact]) -> list[PartArtifact]:
    """The plan's one part and a copy of it per processor in ``plan.replicas`` (appended to
    ``artifacts``): the same ONNX file, run there with that processor's threads, cores and quotas.
    Only a part whose artifact is its ONNX model is copied (a compiled library is built for one
    processor's target)."""
    if not plan.replicas:
        return []
    (first,) = artifacts
    if first.file != first.onnx_file:  # a compiled library is built for one processor's target
        raise CompileError(
            f"replicas: part {first.name} runs {first.file}; only ONNX parts are copied"
        )
    copies = [first]
    for k, name in enumerate(plan.replicas, start=1):
        proc = spec.processor(name)
        if not any(
            b.key == first.backend and b.precision == first.precision for b in proc.backends
        ):
            raise CompileError(
                f"replicas: {name} has no {first.precision} {first.backend} backend for "
                f"{first.name}"
            )
        copies.append(
            replace(
                first,
                name=f"{first.name}_r{k}",
                processor=name,
                threads=proc.threads or (len(proc.cores) if proc.cores else None),
                cores=proc.cores,
                cpu_quota_pct=proc.cpu_quota_pct,
                core_quotas=proc.core_quotas,
                predicted_ms=None,
                note=f"a copy of {first.name} on {name}",
            )
        )
    artifacts[:] = copies
    return copies


def _compile_bands(
    graph: ModelGraph,
    tmp: Path,
    plan: Plan,
    analysis: BandAnalysis,
    spec: DeviceSpec,
    local_cpu: Processor | None,
    settings: BuildSettings,
    artifacts: list[PartArtifact],
    notes: list[str],
) -> BundleBands:
    """Compile the band plans' parts that ``artifacts`` lacks (appended to it); the band table."""
    done = {part_key(p, p.nodes): p.name for p in plan.parts}

    def one(part: Part, pm: PartModel, error: float, producer: dict[str, str]) -> PartArtifact:
        name = pm.name
        job = CompileJob(pm, graph, tmp, f"parts/{name}.onnx", error, settings)
        onnx.save(pm.model, tmp / job.onnx_file)
        art, warning = _compile_part(
            job, replace(part, name=name), spec.processor(part.processor), local_cpu, producer
        )
        notes.extend([warning] if warning else [])
        return art

    new, band_plans = compile_band_parts(graph, tmp, analysis, done, one)
    artifacts.extend(new)
    return bundle_bands(analysis, band_plans, [p.name for p in plan.parts])


def _check_precision(
    graph: ModelGraph,
    tmp: Path,
    plan: Plan,
    band_set: BundleBands | None,
    artifacts: Sequence[PartArtifact],
    given: AccuracyBudget | None,
    check: bool = True,
) -> list[str]:
    """Each of the bundle's plans with int8/fp16 parts, measured as shipped; a note per plan
    (none when not ``check``).

    Raises:
        CompileError: when one misses its budget.
    """
    if not check:
        return []
    by_name = {a.name: a for a in artifacts}
    plans = [("", plan, {p.name: by_name[p.name] for p in plan.parts})]
    for k, bp in enumerate(band_set.plans if band_set else ()):
        plans.append(
            (
                f" (band plan {k})",
                bp.plan,
                {p.name: by_name[n] for p, n in zip(bp.plan.parts, bp.parts)},
            )
        )
    notes = []
    for label, each, arts in plans:
        budget, source = plan_budget(each, given)
        data, _ = recorded_calibration(each.accuracy)
        check = check_precision(graph, each.parts, arts, tmp, budget, source, data)
        require(check, label)
        notes.extend([check.note(label)] if check else [])
    return notes


def _compile_part(
    job: CompileJob,
    part: Part,
    proc: Processor,
    local_cpu: Processor | None,
    producer: Mapping[str, str],
    dynamic: DynamicPart | None = None,
) -> tuple[PartArtifact, str | None]:
    """One part through its backend's compiler; the artifact and a note for the manifest, if any."""
    backend_name = part.backend or "ort"
    compiler = COMPILERS.get(backend_name)
    if compiler is None:
        raise CompileError(
            f"part {part.name}: no compiler for backend '{backend_name}' (compilers: "
            f"{', '.join(COMPILERS)})"
        )
    done = compiler.compile(job, proc, proc.backend(backend_name))
    remote = part.remote or proc.is_remote
    fallback = None
    if remote and local_cpu is not None:
        fallback = {
            "backend": "ort",
            "file": job.onnx_file,
            "processor": local_cpu.name,
            "reason": "runs locally when the server is unreachable or too slow",
        }
    pm: PartModel = job.part
    artifact = PartArtifact(
        name=part.name,
        processor=proc.name,
        backend=done.backend,
        file=done.file,
        onnx_file=job.onnx_file,
        inputs=tuple(_spec(job.graph, t, dynamic) for t in pm.inputs),
        outputs=tuple(_spec(job.graph, t, dynamic) for t in pm.outputs),
        depends_on=tuple(sorted({producer[t] for t in pm.inputs if t in producer})),
        remote=remote,
        provider=done.provider,
        provider_options=dict(done.provider_options),
        target=done.target,
        threads=proc.threads or (len(proc.cores) if proc.cores else None),
        cores=proc.cores,
        cpu_quota_pct=proc.cpu_quota_pct,
        core_quotas=proc.core_quotas,
        fallback=fallback,
        predicted_ms=part.latency_ms,
        note=done.note,
        precision=part.precision,
    )
    return artifact, done.warning
