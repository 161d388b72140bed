"""The bundle: a directory with ``manifest.json`` and the per-part artifacts.

Every file listed in the manifest carries its sha256; :func:`open_bundle` checks the format
version and every checksum before anything is loaded, so a native library is never loaded
before its checksum matches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgesplit.errors import BundleError, PlanError
from edgesplit.optimize.plan import Plan
from edgesplit.util import atomic_write_text, known_fields, sha256_file

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    """Name, static shape and numpy dtype name of a tensor crossing a part boundary."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TensorSpec:
        return TensorSpec(d["name"], tuple(int(x) for x in d["shape"]), d["dtype"])


@dataclass(frozen=True)
class PartArtifact:
    """One part of the bundle.

    Attributes:
        backend: ``ort`` or ``tvm`` (what runs ``file``).
        file: The artifact: ``parts/<name>.onnx`` for ORT, ``parts/<name>.so`` for TVM.
        onnx_file: The part's ONNX model (always there: used by ORT, by fallbacks and by servers).
        remote: True for a part that runs on a server over the network.
        fallback: For a remote part, or a TVM part that could not be built: what runs it locally
            (``{"backend": "ort", "file": ..., "processor": ..., "reason": ...}``), or None.
        depends_on: Names of the parts whose outputs this part reads.
    """

    name: str
    processor: str
    backend: str
    file: str
    onnx_file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    depends_on: tuple[str, ...] = ()
    remote: bool = False
    provider: str = "CPUExecutionProvider"
    provider_options: Mapping[str, Any] = field(default_factory=dict)
    target: Mapping[str, Any] | None = None
    threads: int | None = None
    cores: tuple[int, ...] | None = None
    cpu_quota_pct: float | None = None
    fallback: Mapping[str, Any] | None = None
    predicted_ms: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PartArtifact:
        kw = known_fields(PartArtifact, d)
        kw["inputs"] = tuple(TensorSpec.from_json(t) for t in d["inputs"])
        kw["outputs"] = tuple(TensorSpec.from_json(t) for t in d["outputs"])
        kw["depends_on"] = tuple(d.get("depends_on", ()))
        if d.get("cores") is not None:
            kw["cores"] = tuple(d["cores"])
        return PartArtifact(**kw)


@dataclass(frozen=True)
class Manifest:
    """What a bundle holds. ``files`` maps every relative path to its sha256.

    ``plan`` is the plan the bundle was compiled from; in ``manifest.json`` it is the plan's own
    JSON (:meth:`Plan.to_json`), so a bundle is read by the Java core and older readers alike.
    """

    model_sha256: str
    model_name: str
    device: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parts: tuple[PartArtifact, ...]
    files: Mapping[str, str]
    plan: Plan
    server: str | None = None
    notes: tuple[str, ...] = ()
    format_version: int = FORMAT_VERSION

    def part(self, name: str) -> PartArtifact:
        for p in self.parts:
            if p.name == name:
                return p
        raise BundleError(f"no part '{name}' in the bundle")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["plan"] = self.plan.to_json()
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any], source: str) -> Manifest:
        version = d.get("format_version") if isinstance(d, Mapping) else None
        if version != FORMAT_VERSION:
            raise BundleError(
                f"{source}: manifest format version {version!r}, this edgesplit reads {FORMAT_VERSION}"
            )
        try:
            kw = known_fields(Manifest, d)
            kw["inputs"] = tuple(TensorSpec.from_json(t) for t in d["inputs"])
            kw["outputs"] = tuple(TensorSpec.from_json(t) for t in d["outputs"])
            kw["parts"] = tuple(PartArtifact.from_json(p) for p in d["parts"])
            kw["files"] = dict(d["files"])
            kw["plan"] = Plan.from_json(d["plan"], f"{source}: plan")
            kw["notes"] = tuple(d.get("notes", ()))
            return Manifest(**kw)
        except PlanError as e:
            raise BundleError(str(e)) from e
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise BundleError(f"{source}: malformed manifest ({type(e).__name__}: {e})") from e


def write_manifest(bundle_dir: str | os.PathLike, manifest: Manifest) -> None:
    atomic_write_text(Path(bundle_dir) / MANIFEST, json.dumps(manifest.to_json(), indent=1) + "\n")


def checksums(bundle_dir: Path, files: Sequence[str]) -> dict[str, str]:
    return {f: sha256_file(bundle_dir / f) for f in sorted(files)}


def open_bundle(bundle_dir: str | os.PathLike, *, verify: bool = True) -> Manifest:
    """Read and verify a bundle's manifest and every file it lists.

    Raises:
        BundleError: naming the bundle and the file at fault: a missing manifest or file, another
            format version, or a checksum that does not match (a tampered file).
    """
    root = Path(bundle_dir)
    mpath = root / MANIFEST
    if not root.is_dir():
        raise BundleError(f"{root}: no such bundle directory")
    try:
        data = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise BundleError(f"{mpath}: missing; {root} is not a bundle") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{mpath}: not a JSON manifest ({e})") from e
    manifest = Manifest.from_json(data, str(mpath))
    listed = set(manifest.files)
    for part in manifest.parts:
        for f in (part.file, part.onnx_file, (part.fallback or {}).get("file")):
            if f and f not in listed:
                raise BundleError(
                    f"{mpath}: part {part.name} names {f}, which the manifest has no checksum for"
                )
    if verify:
        for rel, digest in manifest.files.items():
            path = root / rel
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise BundleError(f"{mpath}: file path {rel!r} leaves the bundle")
            if not path.is_file():
                raise BundleError(f"{path}: missing from the bundle")
            if sha256_file(path) != digest:
                raise BundleError(f"{path}: checksum mismatch (the file was changed after compile)")
    return manifest
