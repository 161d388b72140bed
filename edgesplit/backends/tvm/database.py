"""MetaSchedule tuning databases: where they live, and which of them a build may apply.

A database holds the best schedules MetaSchedule found for TIR workloads (one fused kernel each,
such as ``fused_conv2d_add_relu`` at its shapes) on one target. Workloads are keyed by the
structural hash of their TIR function, so a kernel that two models share (a 3x3 conv of resnet18
that mobilenetv2 has too) is one workload: tuned once, applied to both. Schedules depend on the
target, so the databases are kept per *tuning target*: the backend's target plus the ``num-cores``
the processor runs with (:func:`tuning_target`). TVM itself applies a record whatever target it
was tuned for, so we never open a database made for another target:

- the cache, ``$EDGESPLIT_CACHE/tvm-tuning/KEY/`` (``~/.cache/edgesplit``), where KEY hashes the
  tuning target; new records go there unless told otherwise;
- shipped databases, ``profiles/tvm/NAME/``, and folders given explicitly: each has a
  ``target.json`` that names its tuning target and TVM version, and is used only where both match
  (anything else is passed over with a note).

Both are MetaSchedule's own JSON files (``database_workload.json``,
``database_tuning_record.json``),
which TVM appends to as it tunes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.cache import cache_folder
from edgesplit.profile.published import data_dir
from edgesplit.util import atomic_write_text

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
TARGET_FILE = "target.json"


def tuning_target(target: Mapping[str, Any], threads: int | None = None) -> dict[str, Any]:
    """The target schedules are tuned for: ``target`` with ``num-cores`` set (llvm), which decides
    how far MetaSchedule parallelises loops. ``threads`` defaults to the cores this process may
    use."""
    tt = dict(target)
    if tt.get("kind") == "llvm" and "num-cores" not in tt:
        from edgesplit.device.host import usable_cores

        tt["num-cores"] = int(threads or len(usable_cores()))
    return tt


def target_key(tuning: Mapping[str, Any]) -> str:
    """A short stable hash of a tuning target (the name of its cache folder)."""
    return hashlib.sha256(json.dumps(dict(tuning), sort_keys=True).encode()).hexdigest()[:16]


def database_name(tuning: Mapping[str, Any]) -> str:
    """A readable folder name for a shipped database, e.g. ``llvm-haswell-1core``."""
    cpu = tuning.get("mcpu") or (tuning.get("mtriple") or "host").split("-")[0]
    cores = f"-{tuning['num-cores']}core" if "num-cores" in tuning else ""
    return f"{tuning.get('kind', 'llvm')}-{cpu}{cores}"


def cache_dir(tuning: Mapping[str, Any]) -> Path:
    """The cache folder of a tuning target (it may not exist yet)."""
    return cache_folder("tvm-tuning") / target_key(tuning)


def shipped_root() -> Path:
    return data_dir() / "tvm"


def tvm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-tvm")
    except PackageNotFoundError:
        return "unknown"


def _series(v: str) -> str:
    return ".".join(v.split(".")[:2])


@dataclass(frozen=True)
class Lookup:
    """The databases a build for one tuning target may apply, and why others were passed over.

    Attributes:
        paths: Folders holding MetaSchedule JSON files made for exactly this target, best first.
        notes: One line per folder that was not used.
    """

    tuning: Mapping[str, Any]
    paths: tuple[Path, ...]
    notes: tuple[str, ...] = ()


def write_target_file(folder: Path, tuning: Mapping[str, Any], **facts: Any) -> None:
    """Record which tuning target (and TVM version) a database folder is for, keeping the other
    facts already there (the record of tuning runs) unless ``facts`` replaces them."""
    folder.mkdir(parents=True, exist_ok=True)
    old = read_target_file(folder) or {}
    kept = {k: v for k, v in old.items() if k not in ("target", "tvm_version")}
    body = {**kept, "target": dict(tuning), "tvm_version": tvm_version(), **facts}
    atomic_write_text(folder / TARGET_FILE, json.dumps(body, indent=1, sort_keys=True) + "\n")


def read_target_file(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / TARGET_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("target"), dict) else None


def _why_not(folder: Path, tuning: Mapping[str, Any], need_file: bool) -> str | None:
    """None when ``folder`` is a database for ``tuning``, else why not (one line)."""
    if not (folder / WORKLOADS).is_file():
        return f"{folder}: no {WORKLOADS}"
    meta = read_target_file(folder)
    if meta is None:
        return (
            f"{folder}: no readable {TARGET_FILE}, so its target is unknown" if need_file else None
        )
    if meta["target"] != dict(tuning):
        return f"{folder}: tuned for {json.dumps(meta['target'], sort_keys=True)}, not this target"
    if _series(str(meta.get("tvm_version", ""))) != _series(tvm_version()):
        return f"{folder}: made with TVM {meta.get('tvm_version')}, this is {tvm_version()}"
    return None


def find_databases(
    target: Mapping[str, Any],
    threads: int | None = None,
    *,
    extra: Sequence[str | os.PathLike] = (),
    shipped: bool = True,
) -> Lookup:
    """The databases for ``target`` run with ``threads`` threads: ``extra`` folders, the cache, then
    the shipped ones (``profiles/tvm/*``), each only if it was made for this very tuning target."""
    tuning = tuning_target(target, threads)
    paths: list[Path] = []
    notes: list[str] = []
    for folder in [Path(p) for p in extra]:
        why = _why_not(folder, tuning, need_file=True)
        if why is None:
            paths.append(folder)
        elif (folder / WORKLOADS).is_file() or not folder.exists():
            notes.append(why if folder.exists() else f"{folder}: no such folder")
    cached = cache_dir(tuning)
    if cached.is_dir() and _why_not(cached, tuning, need_file=False) is None:
        paths.append(cached)
    root = shipped_root()
    if shipped and root.is_dir():
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            why = _why_not(folder, tuning, need_file=True)
            if why is None:
                paths.append(folder)
    unique = {p.resolve(): p for p in reversed(paths)}  # the first of each folder, in order
    return Lookup(tuning, tuple(p for p in paths if unique[p.resolve()] is p), tuple(notes))


def open_database(paths: Sequence[Path]):
    """One MetaSchedule database over ``paths`` (a union: each workload's best record wins).

    Opened once per process while its files stay the same (:data:`_OPENED`): TVM parses a folder's
    JSON on every open, 0.49 s for the shipped databases, and profiling a model builds one module
    per fused group (164 opens, 80 s of a 280 s ``deploy`` of PP-OCR's recogniser on
    ``host-biglittle``). A folder that tuning has written to since is opened again.
    """
    from tvm.s_tir import meta_schedule as ms

    key = tuple((str(Path(p).resolve()), _stamp(Path(p))) for p in paths)
    with _OPEN_LOCK:
        db = _OPENED.get(key)
        if db is None:
            dbs = [ms.database.JSONDatabase(work_dir=str(p), allow_missing=False) for p in paths]
            db = dbs[0] if len(dbs) == 1 else ms.database.UnionDatabase(*dbs)
            if len(_OPENED) >= _OPENED_MAX:
                _OPENED.clear()
            _OPENED[key] = db
        return db


_OPENED: dict[tuple, Any] = {}
_OPENED_MAX = 8
_OPEN_LOCK = threading.Lock()


def _stamp(folder: Path) -> tuple:
    """What changes when a database folder is written to: its files' sizes and modification
    times."""
    out = []
    for name in (WORKLOADS, RECORDS):
        try:
            st = (folder / name).stat()
        except OSError:
            out.append(None)
        else:
            out.append((st.st_size, st.st_mtime_ns))
    return tuple(out)


def lower_for_tuning(mod, tuning: Mapping[str, Any]):
    """The Relax module as MetaSchedule sees it: legalised, fused, one TIR function per kernel
    (the first half of TVM's ``static_shape_tuning_pipeline``)."""
    import tvm
    from tvm import relax

    with tvm.target.Target(dict(tuning)):
        return tvm.transform.Sequential(
            [
                relax.transform.DecomposeOpsForInference(),
                relax.transform.CanonicalizeBindings(),
                relax.pipeline.zero_pipeline(),
            ]
        )(mod)


def apply_databases(mod, tuning: Mapping[str, Any], paths: Sequence[Path]):
    """Schedule every kernel of a lowered module that the databases know; the rest stay as they are
    (TVM's default schedules apply at build time)."""
    import tvm
    from tvm import relax

    if not paths:
        return mod
    register_tensor_intrinsics(tuning)
    with tvm.target.Target(dict(tuning)), open_database(paths):
        return relax.transform.MetaScheduleApplyDatabase()(mod)


def register_tensor_intrinsics(target: Mapping[str, Any]) -> None:
    """Register the tensor intrinsics of the target's CPU family only.

    TVM 0.27 registers every family's (CUDA, ROCm, Hexagon...) when tuning starts and in each
    builder process; that parses hundreds of TVMScript functions and took 165 s here, 2 minutes
    of it for CUDA's. An llvm schedule can only use its own family's (x86 VNNI, Arm dot products),
    so we import those modules alone, under a package entry that skips the package's ``__init__``.
    Does nothing once the full package is loaded.
    """
    import importlib
    import importlib.util
    import sys

    name = "tvm.s_tir.tensor_intrin"
    if name not in sys.modules:
        spec = importlib.util.find_spec(name)
        if spec is None:
            return
        sys.modules[name] = importlib.util.module_from_spec(spec)
    triple = str(target.get("mtriple", ""))
    if target.get("kind") not in ("llvm", "c"):
        importlib.import_module(name + ".cuda")
    elif triple.startswith(("aarch64", "arm")):
        importlib.import_module(name + ".arm_cpu")
    else:
        importlib.import_module(name + ".x86")
