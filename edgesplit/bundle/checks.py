"""The consistency of a bundle's manifest: what the runtime relies on, checked once at load.

:meth:`Manifest.from_json` checks types and numbers; :func:`check_manifest` checks that the
parts fit together, so that an edited manifest is a one-line error naming it, never a KeyError, a
hang (a part waiting on a part that never runs) or a file written or read outside the bundle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from edgesplit.bundle.safeio import check_relpath
from edgesplit.device.schema import PRECISIONS
from edgesplit.errors import BundleError
from edgesplit.optimize.plan import find_cycle
from edgesplit.util import check_identifier, short

if TYPE_CHECKING:
    from edgesplit.bundle.format import Manifest, PartArtifact, TensorSpec

VALUE_KINDS = ("tensor", "sequence", "optional")
"""What crosses a part boundary: tensors, sequences of tensors, optional values
(``TensorSpec.kind``)."""

MAX_TENSOR_NBYTES = 1 << 32
"""Largest tensor a manifest may declare (4 GiB): a larger claim is an edited manifest."""


def _check_spec(t: TensorSpec, where: str) -> None:
    import numpy as np

    try:
        dtype = np.dtype(t.dtype)
    except (TypeError, ValueError, SyntaxError) as e:
        raise BundleError(
            f"{where}: tensor {short(t.name, 60)}: unknown dtype {short(t.dtype, 40)}"
        ) from e
    if dtype.kind not in "biufO" or dtype.shape != () or dtype.names is not None:
        raise BundleError(
            f"{where}: tensor {short(t.name, 60)}: dtype {short(t.dtype, 40)} is not a numeric "
            "type or strings"
        )
    if t.kind not in VALUE_KINDS:
        raise BundleError(
            f"{where}: tensor {short(t.name, 60)}: unknown kind {short(str(t.kind), 40)}"
        )
    axes = t.dynamic_axes
    if len(set(axes)) != len(axes) or any(not 0 <= k < len(t.shape) for k in axes):
        raise BundleError(
            f"{where}: tensor {short(t.name, 60)}: dynamic_axes {short(list(axes), 40)} are not "
            f"distinct axes of its {len(t.shape)}-d shape"
        )
    nbytes = dtype.itemsize
    for d in t.shape:
        nbytes *= d
    if nbytes > MAX_TENSOR_NBYTES:
        raise BundleError(
            f"{where}: tensor {short(t.name, 60)}: shape {t.shape} is {nbytes:,} bytes, over 4 GiB"
        )


def _same_spec(a: TensorSpec, b: TensorSpec, where: str, what: str) -> None:
    if (a.shape, a.dtype, set(a.dynamic_axes)) != (b.shape, b.dtype, set(b.dynamic_axes)):
        raise BundleError(
            f"{where}: tensor {short(a.name, 60)} is {a.dtype} {a.shown()} here but "
            f"{b.dtype} {b.shown()} in {what}"
        )


def _check_part(p: PartArtifact, i: int, files: Mapping[str, str], source: str) -> None:
    check_identifier(p.name, f"{source}: parts[{i}].name", BundleError)
    where = f"{source}: part {p.name}"
    fb = p.fallback
    if fb is not None and not (isinstance(fb, Mapping) and isinstance(fb.get("file"), str | None)):
        raise BundleError(f"{where}: fallback: expected {{backend, file, ...}}")
    for f in (p.file, p.onnx_file, (fb or {}).get("file")):
        if f and f not in files:
            raise BundleError(
                f"{source}: part {p.name} names {short(f, 80)}, which the manifest has no checksum "
                "for"
            )
    if p.precision not in PRECISIONS:
        raise BundleError(
            f"{where}: precision: {short(p.precision, 20)} is not one of {', '.join(PRECISIONS)}"
        )
    if p.cpu_quota_pct is not None and not 0 < p.cpu_quota_pct <= 100:
        raise BundleError(f"{where}: cpu_quota_pct: {p.cpu_quota_pct} is not in (0, 100]")
    for core, pct in p.core_quotas:
        if not 0 < pct <= 100:
            raise BundleError(f"{where}: core_quotas: core {core}: {pct} is not in (0, 100]")
    if p.threads is not None and p.threads < 1:
        raise BundleError(f"{where}: threads: {p.threads} is not positive")
    for t in (*p.inputs, *p.outputs):
        _check_spec(t, where)


def check_manifest(m: Manifest, source: str) -> None:
    """What the runtime relies on, checked once when a manifest is read: types and numbers, file
    paths inside the bundle, at least one part, part names (identifiers, unique), dependencies on
    parts that exist and that form no cycle, and every tensor a part reads (or the model outputs)
    either a model input or written by a part it depends on, with the same shape and dtype.

    Raises:
        BundleError: naming ``source`` and what is wrong.
    """
    for rel in m.files:
        check_relpath(rel, source)
    if not m.parts:
        raise BundleError(f"{source}: the bundle has no parts (nothing to run)")
    for t in (*m.inputs, *m.outputs):
        _check_spec(t, source)
    names: set[str] = set()
    for i, p in enumerate(m.parts):
        _check_part(p, i, m.files, source)
        if p.name in names:
            raise BundleError(f"{source}: two parts are named {p.name}")
        names.add(p.name)
    if m.replicas:
        _check_replicas(m, names, source)
        return
    if m.bands is None:
        _check_plan_parts(m, m.parts, source)
        return
    _check_bands(m, source)
    for k, bp in enumerate(m.bands.plans):  # an adaptive bundle: every plan's parts fit together
        missing = [n for n in (*bp.parts, *m.bands.default_parts) if n not in names]
        if missing:
            raise BundleError(
                f"{source}: band plan {k} names parts the bundle lacks: "
                f"{short(', '.join(missing), 120)}"
            )
    _check_plan_parts(m, m.plan_parts(), source)
    for k in range(len(m.bands.plans)):
        _check_plan_parts(m, m.plan_parts(k), f"{source}: band plan {k}")


def _check_replicas(m: Manifest, names: set[str], source: str) -> None:
    """Copies of a plan: each names parts the bundle has, no part is in two, every part is in one,
    and each copy's parts fit together as a plan's do."""
    seen: dict[str, int] = {}
    for k, copy in enumerate(m.replicas):
        if not copy:
            raise BundleError(f"{source}: replicas[{k}]: an empty copy")
        for n in copy:
            if n not in names:
                raise BundleError(
                    f"{source}: replicas[{k}] names part {short(n, 60)}, which the bundle lacks"
                )
            if n in seen:
                raise BundleError(f"{source}: part {short(n, 60)} is in replicas {seen[n]} and {k}")
            seen[n] = k
    left = sorted(names - set(seen))
    if left:
        raise BundleError(f"{source}: parts in no copy of replicas: {short(', '.join(left), 120)}")
    if m.bands is not None:
        raise BundleError(f"{source}: a bundle of replicas has no band table")
    by_name = {p.name: p for p in m.parts}
    for k, copy in enumerate(m.replicas):
        _check_plan_parts(m, [by_name[n] for n in copy], f"{source}: replicas[{k}]")


def _check_bands(m: Manifest, source: str) -> None:
    """The band table: contiguous bands of increasing bandwidth, each naming a plan there is."""
    assert m.bands is not None
    n, prev = len(m.bands.plans), None
    if not m.bands.bands or not n:
        raise BundleError(f"{source}: bands: an empty band table")
    for i, b in enumerate(m.bands.bands):
        lo, hi, plan = b.get("lo_mbps"), b.get("hi_mbps"), b.get("plan")
        ok = (
            all(isinstance(x, int | float) and not isinstance(x, bool) for x in (lo, hi))
            and 0 < lo < hi
        )
        if not ok or (prev is not None and lo != prev):
            raise BundleError(
                f"{source}: bands[{i}]: not a band following the one before ({short(b, 80)})"
            )
        if not isinstance(plan, int) or isinstance(plan, bool) or not 0 <= plan < n:
            raise BundleError(
                f"{source}: bands[{i}]: plan {short(plan, 20)} is not one of the {n} plans"
            )
        prev = hi


def _check_plan_parts(m: Manifest, plan_parts: Sequence[PartArtifact], source: str) -> None:
    """The parts of one plan: dependencies that exist and form no cycle, every tensor read written
    by a part depended on (or a model input), with the same shape and dtype."""
    model_in = {t.name: t for t in m.inputs}
    parts: dict[str, PartArtifact] = {p.name: p for p in plan_parts}
    written: dict[str, tuple[str, TensorSpec]] = {}
    for p in plan_parts:
        for t in p.outputs:
            if t.name in written:
                raise BundleError(
                    f"{source}: tensor {short(t.name, 60)} is written by parts "
                    f"{written[t.name][0]} and {p.name}"
                )
            written[t.name] = (p.name, t)
    for p in plan_parts:
        where = f"{source}: part {p.name}"
        for d in p.depends_on:
            if d not in parts:
                raise BundleError(f"{where} depends on part {short(d, 60)}, which the bundle lacks")
        for t in p.inputs:
            if t.name in written:
                src, spec = written[t.name]
                if src not in p.depends_on:
                    raise BundleError(
                        f"{where} reads {short(t.name, 60)} from part {src} without depending on it"
                    )
                _same_spec(t, spec, where, f"part {src}")
            elif t.name in model_in:
                _same_spec(t, model_in[t.name], where, "the model's inputs")
            else:
                raise BundleError(
                    f"{where} reads tensor {short(t.name, 60)}, which no part writes and the model "
                    "does not take"
                )
    cycle = find_cycle({p.name: p.depends_on for p in plan_parts})
    if cycle:
        raise BundleError(
            f"{source}: the parts depend on each other in a cycle ({' -> '.join(cycle)})"
        )
    for t in m.outputs:
        src = written.get(t.name)
        if src is None and t.name not in model_in:
            raise BundleError(f"{source}: model output {short(t.name, 60)} is written by no part")
        _same_spec(
            t,
            src[1] if src else model_in[t.name],
            source,
            f"part {src[0]}" if src else "the model's inputs",
        )
