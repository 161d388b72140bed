"""What edgesplit keeps between runs: one folder per kind under :func:`~edgesplit.cache.cache_root`
(``EDGESPLIT_CACHE``, else ``~/.cache/edgesplit``), listed in :data:`KINDS`, shown and cleared by
``edgesplit cache``.

Every kind is work whose result depends only on its inputs and the code, keyed by both, so that a
cleared folder costs time and nothing else: the next run makes what it needs again. Tuning records
are the exception in cost (hours of MetaSchedule trials), so they are cleared only when named.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.errors import InputError
from edgesplit.util import atomic_write_bytes, atomic_write_text, by_name


@dataclass(frozen=True)
class CacheKind:
    """One folder of kept work: its name, what it holds, and the most it may take (None: no cap)."""

    name: str
    holds: str
    max_nbytes: int | None = None


KEPT_MAX_NBYTES = 2 << 30
"""The most the kept models, and the kept libraries, each take on disk; beyond it the least recently
used go first (:func:`~edgesplit.cache.prune`)."""

KINDS: dict[str, CacheKind] = by_name(
    CacheKind(
        "simplified",
        "models after folding and shape inference",
        KEPT_MAX_NBYTES,
    ),
    CacheKind(
        "tvm-libs",
        "TVM libraries of parts and profiled kernels, built without tuning",
        KEPT_MAX_NBYTES,
    ),
    CacheKind("tvm-tuning", "MetaSchedule tuning records per target (hours of tuning)"),
    CacheKind("calibration", "int8 calibration ranges per model, data and method"),
    CacheKind("accuracy", "measured accuracy of reduced-precision parts"),
    CacheKind("throttle", "the duty cycle's fitted spinner shares per machine, core and share"),
)
SAFE_TO_CLEAR = tuple(k for k in KINDS if k != "tvm-tuning")
"""What ``--clear all`` clears: every kind but the tuning records, which only tuning makes again."""


def cache_folder(kind: str) -> Path:
    """The folder of ``kind`` (one of :data:`KINDS`; it may not exist yet)."""
    return cache_root() / KINDS[kind].name


@dataclass(frozen=True)
class CacheUsage:
    """What one kind's folder holds now."""

    kind: str
    path: Path
    n_files: int
    nbytes: int
    max_nbytes: int | None
    holds: str


def _root() -> Path:
    root = cache_root()
    if root.exists() and not root.is_dir():
        raise InputError(f"EDGESPLIT_CACHE={root}: not a folder")
    return root


def _walk(path: Path) -> tuple[int, int]:
    """Files and their bytes below the kind's folder ``path`` (itself possibly a link to a folder
    elsewhere, which is followed; links below it are not: each counts as one file of its own
    size)."""
    n, nbytes = 0, 0
    try:
        st = path.stat()
    except OSError:  # a broken link
        return 1, 0
    if not stat.S_ISDIR(st.st_mode):
        return 1, st.st_size
    for folder, dirs, files in os.walk(path, followlinks=False):
        for name in [*files, *(d for d in dirs if (Path(folder) / d).is_symlink())]:
            with contextlib.suppress(OSError):
                n, nbytes = n + 1, nbytes + (Path(folder) / name).lstat().st_size
    return n, nbytes


def usage() -> list[CacheUsage]:
    """Every kind's folder, what it holds (empty where it does not exist).

    Raises:
        InputError: ``EDGESPLIT_CACHE`` names something that is not a folder.
    """
    root = _root()
    out = []
    for kind in KINDS.values():
        path = root / kind.name
        n, nbytes = _walk(path) if os.path.lexists(path) else (0, 0)
        out.append(CacheUsage(kind.name, path, n, nbytes, kind.max_nbytes, kind.holds))
    return out


def others() -> list[Path]:
    """Entries of the cache folder that are no kind of :data:`KINDS` (``edgesplit cache`` names
    them and never clears them: the test board of ``scripts/arm64-board.sh`` lives there too)."""
    root = _root()
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir() if p.name not in KINDS and not p.name.startswith(".clearing-")
    )


def check_kinds(names: Iterable[str]) -> tuple[str, ...]:
    """The kinds named (``all``: :data:`SAFE_TO_CLEAR`), in :data:`KINDS` order.

    Raises:
        InputError: a name that is no kind, with the kinds there are.
    """
    names = list(names)
    unknown = [n for n in names if n != "all" and n not in KINDS]
    if unknown:
        raise InputError(
            f"no cache kind {', '.join(map(repr, unknown))} (kinds: {', '.join(KINDS)}, or all)"
        )
    wanted = set(SAFE_TO_CLEAR if "all" in names else ()) | {n for n in names if n != "all"}
    return tuple(k for k in KINDS if k in wanted)


def clear(kinds: Sequence[str]) -> list[CacheUsage]:
    """Delete the folders of ``kinds`` (see :func:`check_kinds`); returns what they held.

    Each folder is first renamed aside, in one step, then deleted: another edgesplit process sees
    the folder whole or not at all (a kept file it was about to read is then made again), and a
    crash midway leaves a ``.clearing-*`` folder, never a half-deleted kind. A kind whose folder is
    a link to a folder elsewhere (moved to a bigger disk) keeps its link and that folder; what the
    folder holds is deleted.

    Raises:
        InputError: an unknown kind, or ``EDGESPLIT_CACHE`` not a folder.
    """
    chosen = check_kinds(kinds)
    root = _root()
    before = {u.kind: u for u in usage()}
    for leftover in root.glob(".clearing-*") if root.is_dir() else ():  # a clear that crashed
        _remove(leftover)
    cleared = []
    for kind in chosen:
        path = root / kind
        if not os.path.lexists(path):
            continue
        if path.is_symlink() and path.is_dir():
            _empty(path.resolve())  # the kind moved to another disk: clear there, keep the link
        else:
            aside = root / f".clearing-{kind}-{os.getpid()}"
            os.replace(path, aside)
            _remove(aside)
        cleared.append(before[kind])
    return cleared


def _remove(path: Path) -> None:
    """Delete ``path``: a folder with what it holds, a file or a link (never what a link points
    to)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _empty(folder: Path) -> None:
    """Delete what ``folder`` holds (links in it deleted, not followed), not the folder."""
    for entry in folder.iterdir():
        _remove(entry)


def cache_root() -> Path:
    """Where results worth keeping between runs live (measured accuracy, calibration ranges,
    simplified models, tuning records): ``EDGESPLIT_CACHE``, else ``~/.cache/edgesplit``."""
    return Path(
        os.environ.get("EDGESPLIT_CACHE") or os.path.join(Path.home(), ".cache", "edgesplit")
    )


def touch(*paths: str | os.PathLike) -> None:
    """Mark kept files as just used (their modification time), so :func:`prune` keeps them
    longest."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.utime(path)


def read_kept(path: Path) -> tuple[bytes, dict[str, Any]] | None:
    """A kept file's bytes and the facts beside it (``path`` with ``.json``), or None when either is
    missing or unreadable, or the bytes are not those the facts were written with (their sha256:
    a truncated or edited file is not used). A file read is touched (:func:`prune`)."""
    try:
        facts = json.loads(path.with_suffix(".json").read_text())
        data = path.read_bytes()
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(facts, dict) or facts.get("sha256") != hashlib.sha256(data).hexdigest():
        return None
    touch(path, path.with_suffix(".json"))
    return data, facts


def keep(path: Path, data: bytes, facts: Mapping[str, Any], max_nbytes: int) -> None:
    """Keep ``data`` at ``path`` with ``facts`` and its sha256 beside it (written last: they mark
    the pair complete), then :func:`prune` the folder to ``max_nbytes``. A cache that cannot be
    written (read-only, full, a file where a folder goes) keeps nothing."""
    try:
        atomic_write_bytes(path, data)
        atomic_write_text(
            path.with_suffix(".json"),
            json.dumps({**facts, "sha256": hashlib.sha256(data).hexdigest()}),
        )
    except (OSError, TypeError, ValueError):
        return
    prune(path.parent, max_nbytes)


def prune(folder: str | os.PathLike, max_nbytes: int) -> list[Path]:
    """Delete the least recently used files of a cache folder (by modification time: :func:`touch`
    on use) until what is left is at most ``max_nbytes``; returns what was deleted. Files that
    vanish or cannot be deleted meanwhile (another process pruning) are passed over."""
    entries = []
    for f in Path(folder).iterdir() if Path(folder).is_dir() else ():
        with contextlib.suppress(OSError):
            st = f.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                entries.append((st.st_mtime_ns, st.st_size, f))
    total = sum(size for _, size, _ in entries)
    gone = []
    for _, size, f in sorted(entries):
        if total <= max_nbytes:
            break
        with contextlib.suppress(OSError):
            f.unlink()
            gone.append(f)
            total -= size
    return gone


def code_tag(*modules: str, versions: Collection[str] = ()) -> str:
    """A hash of the ``versions`` of packages and the sources of ``modules`` (by name): what a kept
    result is keyed by besides its inputs. A source is read through its module's loader, so it is
    found where edgesplit runs from a zip archive (the profiling agent)."""
    import importlib
    from importlib import metadata

    h = hashlib.sha256()
    for package in versions:
        h.update(f"{package}={metadata.version(package)};".encode())
    for name in modules:
        module = importlib.import_module(name)
        h.update(module.__loader__.get_data(module.__file__))  # type: ignore[union-attr]
    return h.hexdigest()
