"""The bundle: a directory with ``manifest.json`` and the per-part artifacts.

Every file listed in the manifest carries its sha256. :func:`open_verified` checks the signature
(with a trusted key), the manifest's own consistency, the format version and every checksum
before anything is loaded; then the runtime loads each part from the bytes it checks again as it
reads them (:class:`VerifiedBundle`), so a native library is never loaded before its checksum
matches, and never from a file that could have changed since. No symlink inside a bundle is
followed (:mod:`edgesplit.bundle.safeio`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesplit.bundle.checks import check_manifest
from edgesplit.bundle.safeio import copy_checked, hash_checked, read_checked
from edgesplit.bundle.signing import (
    SIGNATURE,
    check_signature,
    key_id,
    load_public_key,
    write_signature,
)
from edgesplit.bundle.verdict import Verification
from edgesplit.errors import BundleError, PlanError
from edgesplit.model.values import shape_fits
from edgesplit.optimize.plan import Plan
from edgesplit.util import (
    MAX_JSON_NBYTES,
    atomic_write_bytes,
    check_fields,
    dump_json,
    known_fields,
    parse_json_object,
    read_json_object,
    sha256_file,
    short,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and numpy dtype name of a value crossing a part boundary; ``kind``
    ``"sequence"`` or ``"optional"`` for those (their tensors' dtype; see ``TensorInfo``).

    ``shape`` is the shape the bundle was compiled and checked with. ``dynamic_axes`` lists the
    axes whose length may differ at run time (a decoder's sequence and cache lengths): the part's
    ONNX file leaves them symbolic. Empty (and absent from the JSON): every dimension is fixed.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "tensor"
    dynamic_axes: tuple[int, ...] = ()

    def fits(self, shape: Sequence[int]) -> bool:
        """Whether an array of ``shape`` is one this value takes (any length on a dynamic axis)."""
        return shape_fits(tuple(shape), self.shape, self.dynamic_axes)

    def shown(self) -> list[int | str]:
        """The shape for messages: ``"?"`` on each dynamic axis."""
        return ["?" if k in self.dynamic_axes else d for k, d in enumerate(self.shape)]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.kind != "tensor":
            d["kind"] = self.kind
        if self.dynamic_axes:
            d["dynamic_axes"] = list(self.dynamic_axes)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TensorSpec:
        return TensorSpec(
            d["name"],
            tuple(d["shape"]),
            d["dtype"],
            d.get("kind", "tensor"),
            tuple(d.get("dynamic_axes", ())),
        )


def _tensors_json(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` (an ``asdict``) with ``dynamic_axes`` left out of its static tensors: a bundle
    without dynamic axes writes the manifest older readers wrote."""
    for key in ("inputs", "outputs"):
        for t in d.get(key, ()):
            if not t.get("dynamic_axes"):
                t.pop("dynamic_axes", None)
    return d


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
        precision: What ``file`` runs in (``fp32``, ``fp16``, ``int8``); ``onnx_file`` is fp32.
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
    precision: str = "fp32"
    core_quotas: tuple[tuple[int, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _tensors_json(asdict(self))

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PartArtifact:
        kw = known_fields(PartArtifact, d)
        kw["inputs"] = tuple(TensorSpec.from_json(t) for t in d["inputs"])
        kw["outputs"] = tuple(TensorSpec.from_json(t) for t in d["outputs"])
        kw["depends_on"] = tuple(d.get("depends_on", ()))
        if d.get("cores") is not None:
            kw["cores"] = tuple(d["cores"])
        kw["core_quotas"] = tuple((int(c), float(q)) for c, q in d.get("core_quotas", ()))
        return PartArtifact(**kw)


@dataclass(frozen=True)
class BandPlan:
    """One plan of a band table as the bundle holds it: the plan and the names of its parts in
    :attr:`Manifest.parts` (parts shared between plans are stored, and named, once)."""

    plan: Plan
    parts: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"parts": list(self.parts), "plan": self.plan.to_json()}


@dataclass(frozen=True)
class BundleBands:
    """The band table of a bundle: which plan to run at which uplink rate.

    Attributes:
        bands: ``{"lo_mbps", "hi_mbps", "plan", "value_lo", "value_hi"}`` in increasing bandwidth,
            contiguous; ``plan`` indexes :attr:`plans`.
        plans: The plans of the table.
        default_parts: The parts of :attr:`Manifest.plan` (what runs when no band is chosen).
        down_ratio: Downlink over uplink rate of the link the table was made for (the table moves
            both together).
        rtt_ms: That link's round-trip time.
    """

    objective: str
    lo_mbps: float
    hi_mbps: float
    bands: tuple[Mapping[str, Any], ...]
    plans: tuple[BandPlan, ...]
    default_parts: tuple[str, ...]
    down_ratio: float = 1.0
    rtt_ms: float = 0.0
    solver_calls: int = 0
    time_s: float = 0.0

    @property
    def breakpoints_mbps(self) -> tuple[float, ...]:
        return tuple(float(b["lo_mbps"]) for b in self.bands[1:])

    def plan_at(self, bandwidth_mbps: float) -> int:
        """The plan of the band holding ``bandwidth_mbps`` (the end bands beyond the range)."""
        for b in self.bands:
            if bandwidth_mbps < b["hi_mbps"]:
                return int(b["plan"])
        return int(self.bands[-1]["plan"])

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["plans"] = [p.to_json() for p in self.plans]
        d["breakpoints_mbps"] = list(self.breakpoints_mbps)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any], source: str) -> BundleBands:
        kw = known_fields(BundleBands, d)
        kw["bands"] = tuple(dict(b) for b in d["bands"])
        kw["plans"] = tuple(
            BandPlan(Plan.from_json(p["plan"], f"{source}: band plan {k}"), tuple(p["parts"]))
            for k, p in enumerate(d["plans"])
        )
        kw["default_parts"] = tuple(d["default_parts"])
        return BundleBands(**kw)


@dataclass(frozen=True)
class Manifest:
    """What a bundle holds. ``files`` maps every relative path to its sha256.

    ``plan`` is the plan the bundle was compiled from; in ``manifest.json`` it is the plan's own
    JSON (:meth:`Plan.to_json`), so a bundle is read by the Java core and older readers alike.

    ``bands`` (an adaptive bundle): a plan per bandwidth band. Then ``parts`` is the union of the
    parts of every plan (the server serves them all) and :meth:`plan_parts` gives one plan's.
    ``verification`` is what measuring the plan against the baselines found (``deploy``,
    ``compile --verify``), or None when it was not verified.

    ``replicas``: the part names of each whole copy of the plan (one per processor, see
    :attr:`Plan.replicas`); a request runs the parts of one copy. Empty: one copy, every part.
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
    verification: Verification | None = None
    format_version: int = FORMAT_VERSION
    bands: BundleBands | None = None
    replicas: tuple[tuple[str, ...], ...] = ()

    def part(self, name: str) -> PartArtifact:
        for p in self.parts:
            if p.name == name:
                return p
        raise BundleError(f"no part '{name}' in the bundle")

    def plan_parts(self, band_plan: int | None = None) -> tuple[PartArtifact, ...]:
        """The parts one plan runs: band plan ``band_plan``, or (None) :attr:`plan`'s.

        Each part's ``depends_on`` is that plan's (a part shared by two plans may read from
        different parts in each).
        """
        if self.bands is None:
            if band_plan is not None:
                raise BundleError("the bundle has no band table (compile it with bands)")
            return self.parts
        if band_plan is not None and not 0 <= band_plan < len(self.bands.plans):
            raise BundleError(f"no band plan {band_plan}: the bundle has {len(self.bands.plans)}")
        names = self.bands.default_parts if band_plan is None else self.bands.plans[band_plan].parts
        parts = [self.part(n) for n in names]
        producer = {t.name: p.name for p in parts for t in p.outputs}
        return tuple(
            replace(
                p,
                depends_on=tuple(
                    sorted({producer[t.name] for t in p.inputs if t.name in producer})
                ),
            )
            for p in parts
        )

    def to_json(self) -> dict[str, Any]:
        d = _tensors_json(asdict(self))
        d["parts"] = [_tensors_json(p) for p in d["parts"]]
        d["plan"] = self.plan.to_json()
        if self.bands is None:
            del d["bands"]
        else:
            d["bands"] = self.bands.to_json()
        d["verification"] = self.verification.to_json() if self.verification else None
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any], source: str) -> Manifest:
        version = d.get("format_version") if isinstance(d, Mapping) else None
        if version != FORMAT_VERSION:
            raise BundleError(
                f"{source}: manifest format version {version!r}, this edgesplit reads "
                f"{FORMAT_VERSION}"
            )
        try:
            kw = known_fields(Manifest, d)
            kw["inputs"] = tuple(TensorSpec.from_json(t) for t in d["inputs"])
            kw["outputs"] = tuple(TensorSpec.from_json(t) for t in d["outputs"])
            kw["parts"] = tuple(PartArtifact.from_json(p) for p in d["parts"])
            kw["files"] = dict(d["files"])
            kw["plan"] = Plan.from_json(d["plan"], f"{source}: plan")
            kw["notes"] = tuple(d.get("notes", ()))
            kw["replicas"] = tuple(tuple(r) for r in d.get("replicas", ()))
            if d.get("bands") is not None:
                kw["bands"] = BundleBands.from_json(d["bands"], source)
            if d.get("verification") is not None:
                kw["verification"] = Verification.from_json(d["verification"])
            manifest = Manifest(**kw)
        except PlanError as e:
            raise BundleError(str(e)) from e
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise BundleError(
                f"{source}: malformed manifest ({type(e).__name__}: {short(str(e), 200)})"
            ) from e
        check_fields(manifest, source, BundleError)
        for p in manifest.parts:
            check_fields(p, f"{source}: part {short(p.name, 60)}", BundleError)
            for t in (*p.inputs, *p.outputs):
                check_fields(
                    t,
                    f"{source}: part {short(p.name, 60)}: tensor {short(t.name, 60)}",
                    BundleError,
                )
        for t in (*manifest.inputs, *manifest.outputs):
            check_fields(t, f"{source}: tensor {short(t.name, 60)}", BundleError)
        if manifest.verification is not None:
            check_fields(manifest.verification, f"{source}: verification", BundleError)
            for c in manifest.verification.candidates:
                where = f"{source}: verification: candidate {short(c.name, 60)}"
                check_fields(c, where, BundleError, signed=("snr_db",))
        return manifest


def write_manifest(
    bundle_dir: str | os.PathLike, manifest: Manifest, sign_key: Ed25519PrivateKey | None = None
) -> None:
    """Write ``manifest.json`` atomically and, with ``sign_key``, its signature beside it."""
    root = Path(bundle_dir)
    data = dump_json(manifest.to_json()).encode()
    atomic_write_bytes(root / MANIFEST, data)
    if sign_key is not None:
        write_signature(root, data, sign_key)


def checksums(bundle_dir: Path, files: Sequence[str]) -> dict[str, str]:
    return {f: sha256_file(bundle_dir / f) for f in sorted(files)}


@dataclass(frozen=True)
class VerifiedBundle:
    """An opened bundle: its manifest, checked, and access to its files as checked bytes.

    Every read checks the bytes it returns against the manifest's sha256 again (through one file
    descriptor, no symlinks), so what is loaded is what was checked. ``os.PathLike``: it stands
    for its directory where a path is expected.

    Attributes:
        manifest_bytes: The exact bytes the manifest (and its signature, if trusted) was read from.
        trusted_key: The id of the key whose signature was checked, or None.
    """

    root: Path
    manifest: Manifest
    manifest_bytes: bytes = field(repr=False)
    trusted_key: str | None = None

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    def __truediv__(self, other: str) -> Path:
        return self.root / other

    def _digest(self, rel: str) -> str:
        digest = self.manifest.files.get(rel)
        if digest is None:
            raise BundleError(f"{self.root / rel}: not listed in the manifest")
        return digest

    def read(self, rel: str) -> bytes:
        """The file's bytes, checked against the manifest as they are read (ONNX parts load from
        these)."""
        return read_checked(self.root, rel, self._digest(rel))

    @contextlib.contextmanager
    def private_copy(self, rel: str) -> Iterator[Path]:
        """A checked copy in a private folder, removed after the block (native libraries load
        this)."""
        with copy_checked(self.root, rel, self._digest(rel)) as path:
            yield path


def open_verified(
    bundle_dir: str | os.PathLike,
    *,
    trust_key: str | os.PathLike | Ed25519PublicKey | None = None,
    verify: bool = True,
) -> VerifiedBundle:
    """Open a bundle: signature (with ``trust_key``), manifest, and (with ``verify``) every
    checksum.

    Args:
        trust_key: A public key (a file: PEM, OpenSSH, or the private key file); the manifest must
            carry a valid signature by it, checked before the manifest is even parsed.

    Raises:
        BundleError: naming the bundle and the file at fault: a missing or malformed manifest,
            another format version, a bad signature, a symlink or special file, a checksum that
            does not match (a tampered file).
        InputError: a trusted key file that cannot be read.
    """
    root = Path(bundle_dir)
    key = load_public_key(trust_key) if trust_key is not None else None
    if not root.is_dir():
        raise BundleError(f"{root}: no such bundle directory")
    mpath = root / MANIFEST
    if not os.path.lexists(mpath):
        raise BundleError(f"{mpath}: missing; {root} is not a bundle")
    raw = read_checked(root, MANIFEST, None, max_nbytes=MAX_JSON_NBYTES)
    trusted = None
    if key is not None:
        has_sig = os.path.lexists(root / SIGNATURE)
        sig = read_checked(root, SIGNATURE, None, max_nbytes=1 << 16) if has_sig else None
        check_signature(raw, sig, key, str(root))
        trusted = key_id(key)
    manifest = Manifest.from_json(
        parse_json_object(raw, mpath, BundleError, "manifest"), str(mpath)
    )
    check_manifest(manifest, str(mpath))
    if verify:
        for rel, digest in manifest.files.items():
            hash_checked(root, rel, digest)
    return VerifiedBundle(root, manifest, raw, trusted)


def open_bundle(
    bundle_dir: str | os.PathLike,
    *,
    verify: bool = True,
    trust_key: str | os.PathLike | Ed25519PublicKey | None = None,
) -> Manifest:
    """Read and verify a bundle's manifest and every file it lists (see :func:`open_verified`).

    Raises:
        BundleError: naming the bundle and the file at fault.
    """
    return open_verified(bundle_dir, trust_key=trust_key, verify=verify).manifest


def as_verified(bundle: VerifiedBundle | str | os.PathLike) -> VerifiedBundle:
    """A :class:`VerifiedBundle` as it is, or a bundle directory opened and verified."""
    return bundle if isinstance(bundle, VerifiedBundle) else open_verified(bundle)


def sign_bundle(bundle_dir: str | os.PathLike, key: str | os.PathLike | Ed25519PrivateKey) -> str:
    """Sign an existing bundle (after checking every checksum); returns the key id.

    Raises:
        BundleError: for a bundle that does not verify; InputError: for a key that cannot be read.
    """
    from edgesplit.bundle.signing import load_private_key

    private = load_private_key(key)
    vb = open_verified(bundle_dir)
    write_signature(vb.root, vb.manifest_bytes, private)
    return key_id(private.public_key())


def is_bundle_dir(path: Path) -> bool:
    """Whether ``path`` holds an edgesplit bundle and nothing else (what ``-o`` may replace)."""
    try:
        data = read_json_object(path / MANIFEST, BundleError, "manifest")
    except BundleError:
        return False
    files = data.get("files")
    if "format_version" not in data or not isinstance(files, dict):
        return False
    allowed = {MANIFEST, SIGNATURE, *files}
    for folder, dirs, names in os.walk(path):
        rel = Path(folder).relative_to(path)
        for d in dirs:
            if (Path(folder) / d).is_symlink():
                return False
        for n in names:
            if (rel / n).as_posix() not in allowed:
                return False
    return True
