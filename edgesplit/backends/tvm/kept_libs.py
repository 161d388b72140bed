"""TVM libraries kept on disk between builds (``<cache>/tvm-libs``, :mod:`edgesplit.cache`).

Compiling a part with TVM takes seconds (a minute for a large one), and the same part is built
again and again: ``partition`` then ``deploy`` of one model, a ``deploy`` after changing an option
that does not move the cut, the test suite. The profiler compiles every fused kernel of a model
(:mod:`edgesplit.backends.tvm.profile`), and profiling the same model again, or another with the
same
kernels, compiles the same kernels again. A library depends only on the model, the target, the
thread count, the tuning databases applied, the cross compiler and the code that builds it, so it
is kept, keyed by all of them: the model's bytes, the target and the tuning target it resolves to
on this host, the bytes of every database applied, the compiler's name, and TVM's version with the
source of the modules that build (the builder's own: the compiler's parts and the profiler's
kernels are kept apart). Builds that tune, and CUDA libraries (whose kernels may be kept as source
depending on the driver), are not kept. A kept file that cannot be read is built again and
replaced; a cache that cannot be written keeps nothing. The folder holds at most
:data:`MAX_NBYTES`; past it the least recently used files go (:func:`~edgesplit.cache.prune`).
"""

from __future__ import annotations

import contextlib
import functools
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from edgesplit.backends.tvm import database as tvmdb
from edgesplit.backends.tvm.database import RECORDS, WORKLOADS, Lookup, tuning_target
from edgesplit.cache import KINDS, cache_folder, code_tag, keep, read_kept
from edgesplit.model.kept import model_digest
from edgesplit.util import atomic_write_bytes, sha256_file

MAX_NBYTES = KINDS["tvm-libs"].max_nbytes
"""The most the kept libraries take on disk; beyond it the least recently used go first."""


@functools.cache
def _code_tag(builder: str) -> str:
    """TVM's version and the sources of the builder (a module's name), the databases and this."""
    return code_tag(builder, tvmdb.__name__, __name__, versions=("apache-tvm",))


@dataclass(frozen=True)
class KeptLibrary:
    """Where one build's library (``.so``) and its facts (``.json``) are kept."""

    path: Path

    def fetch(self, out: Path) -> dict[str, Any] | None:
        """Copy the kept library to ``out`` and return the build's facts; None when there is none
        (or it cannot be read: then it is built again and replaced)."""
        found = read_kept(self.path)
        if found is None or not isinstance(found[1].get("info"), dict) or not found[0]:
            return None
        atomic_write_bytes(out, found[0])
        return found[1]["info"]

    def keep(self, out: Path, info: Mapping[str, Any]) -> None:
        """Keep the library just built at ``out`` with the build's facts."""
        with contextlib.suppress(OSError):
            keep(self.path, out.read_bytes(), {"info": dict(info)}, MAX_NBYTES)


def kept_library(
    model: onnx.ModelProto,
    target: Mapping[str, Any],
    threads: int | None,
    lookup: Lookup | None,
    cross_compiler: str | None,
    builder: str,
) -> KeptLibrary | None:
    """Where a build of ``model`` for ``target`` with ``threads`` threads and the databases of
    ``lookup`` (None: none applied) by the module named ``builder`` is kept; None for a
    CUDA target, or a model over protobuf's 2 GB."""
    if target.get("kind") == "cuda":
        return None
    facts = {
        "target": dict(target),
        "tuning": tuning_target(target, threads),
        "machine": platform.machine(),
        "cross_compiler": cross_compiler,
        "databases": [str(p) for p in lookup.paths] if lookup is not None else None,
    }
    databases = [
        _file_digest(folder / name)
        for folder in (lookup.paths if lookup else ())
        for name in (WORKLOADS, RECORDS)
    ]
    digest = model_digest(model, _code_tag(builder), facts, *databases)
    if digest is None:
        return None
    return KeptLibrary(cache_folder("tvm-libs") / f"{digest}.so")


def _file_digest(path: Path) -> bytes:
    try:
        return sha256_file(path).encode()
    except OSError:  # a database without this file: nothing of it is applied
        return b"-"
