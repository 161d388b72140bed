"""Compile a part with Apache TVM for its processor's target and export a shared library.

- host llvm: built and exported with the system compiler;
- cross targets (``mtriple`` not this machine's): exported with ``<triple>-gcc``; a missing cross
  toolchain is a clear error naming the package to install;
- cuda: TVM's default GPU pipeline (dlight schedules).
Tuning (:mod:`edgesplit.backends.tvm.tune`) and the databases a build applies
(:mod:`edgesplit.backends.tvm.database`) are per tuning target: the target and the thread count.

:class:`TvmLibrary` runs a built library; the compiler's check (:func:`check_library`) and the
runtime's TVM executor both use it, so compile needs nothing from the runtime.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgesplit.backends.tvm.database import (
    apply_databases,
    cache_dir,
    find_databases,
    lower_for_tuning,
    tuning_target,
)
from edgesplit.backends.tvm.kept_libs import kept_library
from edgesplit.backends.tvm.profile import GPU_KINDS, host_arch, target_arch, target_device
from edgesplit.backends.tvm.tune import Progress, TuneOptions, tune_module
from edgesplit.errors import CompileError
from edgesplit.model.values import rel_error


def cross_compiler(target: Mapping[str, Any]) -> str | None:
    """The C compiler to link the library with; None for the host compiler.

    Raises:
        CompileError: naming the missing cross toolchain.
    """
    if target.get("kind") not in ("llvm", "c") or target_arch(target) == host_arch():
        return None
    triple = target["mtriple"]
    cc = f"{triple}-gcc"
    if shutil.which(cc) is None:
        pkg = f"gcc-{triple}"
        raise CompileError(
            f"target {json.dumps(dict(target))} needs the cross compiler {cc}, which is not "
            "installed "
            f"(on Debian/Ubuntu: apt-get install {pkg})"
        )
    return cc


def tuning_dir(target: Mapping[str, Any], threads: int | None = None) -> Path:
    """The cache folder of MetaSchedule's database for ``target`` run with ``threads`` threads
    (default: the cores this process may use); later compiles for the same target reuse it."""
    return cache_dir(tuning_target(target, threads))


def build_library(
    model: onnx.ModelProto,
    target: Mapping[str, Any],
    out: Path,
    *,
    tune_trials: int = 0,
    tune: TuneOptions | None = None,
    threads: int | None = None,
    databases: Sequence[str | os.PathLike] | None = (),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Import, (tune,) compile and export ``model`` as a shared library at ``out``.

    Args:
        tune_trials: A total budget, spread at up to 64 trials per kernel (``tune`` says more).
        databases: Apply the schedules that databases for this target hold (the cache, the
            shipped ``profiles/tvm/`` ones and these), even when nothing is tuned now; ``None``:
            apply none.
        tune: Tune first (:class:`~edgesplit.backends.tvm.tune.TuneOptions`); its ``threads`` wins.
        threads: The threads the part runs with (the processor's); databases are per thread count.

    Returns facts for the manifest: target, trials, the databases applied, what tuning did; and
    ``kept``, the cache file, when the library was kept from an earlier build of the same part
    (:mod:`edgesplit.backends.tvm.kept_libs`; builds that tune are never kept).
    Raises CompileError for a missing toolchain; any TVM import or build error propagates for the
    caller to fall back on.
    """
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    use_database = databases is not None
    databases = databases or ()
    cc = cross_compiler(target)
    if tune is None and tune_trials > 0:
        tune = TuneOptions(
            trials_per_task=min(64, tune_trials), max_trials=tune_trials, threads=threads
        )
    threads = tune.threads if tune is not None and tune.threads else threads
    kept, lookup = None, None
    if tune is None:  # a build that tunes changes the databases: built every time
        lookup = find_databases(target, threads, extra=databases) if use_database else None
        kept = kept_library(model, target, threads, lookup, cc, __name__)
        info = kept.fetch(out) if kept is not None else None
        if info is not None:
            return {**info, "kept": str(kept.path)}
    info = {"target": dict(target), "tune_trials": tune_trials}
    with contextlib.redirect_stdout(io.StringIO()):
        mod = from_onnx(model, keep_params_in_input=False)
        tgt = tvm.target.Target(dict(target))
        if tune is not None:
            mod, report = tune_module(mod, target, tune, progress)
            info["tuning"] = {
                k: v for k, v in dataclasses.asdict(report).items() if k != "task_names"
            }
            # the databases again: tuning has just added its records
            lookup = find_databases(target, threads, extra=databases) if use_database else None
        if lookup is not None and lookup.paths:
            if tune is None:
                mod = lower_for_tuning(mod, lookup.tuning)
            mod = apply_databases(mod, lookup.tuning, lookup.paths)
            tgt = tvm.target.Target(dict(lookup.tuning))
            info["tuning_database"] = str(lookup.paths[0])
            info["tuning_databases"] = [str(p) for p in lookup.paths]
        if lookup is not None and lookup.notes:
            info["tuning_notes"] = list(lookup.notes)
        ex = tvm.compile(mod, target=tgt)
    if target.get("kind") == "cuda" and _cuda_kernels_kept_as_source():
        info["cuda_kernels"] = "source"
    out.parent.mkdir(parents=True, exist_ok=True)
    if cc:
        ex.export_library(str(out), fcompile=_cross_fcompile(cc))
    else:
        ex.export_library(str(out))
    if kept is not None:
        kept.keep(out, info)
    return info


def _cuda_kernels_kept_as_source() -> bool:
    """Whether TVM keeps a CUDA library's kernels as CUDA C++ rather than compiling them: it does
    where no CUDA driver is (no ``ffi.Module.create.cuda``: a build machine without a GPU), and the
    TVM that loads the part compiles them then with NVRTC, so that machine needs a full TVM,
    ``cuda-bindings`` and CUDA's headers (``benchmarks/server_gpu.py`` ran such parts on an
    H200)."""
    import tvm_ffi

    return tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None


def _cross_fcompile(cc: str):
    import tvm

    return tvm.support.cc.cross_compiler(cc) if hasattr(tvm.support, "cc") else cc


class TvmLibrary:
    """A built library in a Relax VM, on the device its target names (the CPU for llvm and c).

    Raises:
        LookupError: when that device is not present on this machine.
    """

    def __init__(self, path: str | os.PathLike, target: Mapping[str, Any] | None):
        import tvm
        from tvm.runtime.vm import VirtualMachine  # = relax.VirtualMachine, without the compiler

        kind = (target or {}).get("kind", "llvm")
        if kind in GPU_KINDS:
            _load_device_runtime(kind)
        lib = tvm.runtime.load_module(str(path))
        self.device = target_device(target or {})
        if not self.device.exist:
            raise LookupError(f"its {kind} device is not present on this machine")
        self._vm = VirtualMachine(lib, self.device)
        self._tensor = tvm.runtime.tensor

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """``main`` on the inputs in order; the outputs in order."""
        return self.outputs(self.call(self.tensors(arrays)))

    def tensors(self, arrays: list[np.ndarray]) -> list:
        """The inputs as TVM tensors on the library's device."""
        return [self._tensor(np.ascontiguousarray(a), self.device) for a in arrays]

    def call(self, args: list):
        """``main`` itself (what a runtime times as the backend's run call)."""
        return self._vm["main"](*args)

    def outputs(self, raw) -> list[np.ndarray]:
        return [v.numpy() for v in ([raw] if hasattr(raw, "numpy") else list(raw))]

    def close(self) -> None:
        self._vm = None


def _load_device_runtime(kind: str) -> None:
    """Load TVM's runtime for ``kind``'s device (``libtvm_runtime_cuda`` and the like), which
    registers the loader of libraries built for it.

    A full TVM loads every backend's at import, and leaves out, without a word, one whose driver
    is missing; a runtime-only TVM (``TVM_USE_RUNTIME_LIB=1``, or no compiler library: a server
    that only runs bundles) loads none. Either way TVM's own error is then "a loader of that name
    is not registered". Loading it here again is free where it is loaded, and names the cause
    where it cannot be.

    Raises:
        LookupError: this TVM has no runtime for ``kind``, or it does not load here (its driver).
    """
    import ctypes

    import tvm

    lib = Path(tvm.__file__).parent / "lib" / f"libtvm_runtime_{kind}.so"
    if not lib.exists():
        raise LookupError(f"this TVM has no {kind} runtime ({lib.name} is not in {lib.parent})")
    try:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise LookupError(f"its {kind} runtime does not load on this machine ({e})") from e


def check_library(
    lib: Path, target: Mapping[str, Any], feeds: dict[str, np.ndarray], want: list[np.ndarray]
) -> float:
    """Run a built library on ``feeds`` (in the part's input order); the largest relative error
    against ``want`` (what ORT computed), which must be within 1e-4.

    Raises:
        RuntimeError: when the library's outputs differ from ``want``.
    """
    import tempfile

    # Load a private copy: the library stays mapped in this process until exit, and the bundle's
    # own file must stay free to be moved, replaced or (in tests) tampered with.
    with tempfile.TemporaryDirectory(prefix="edgesplit-tvm-check-") as tmp:
        copy = Path(tmp) / lib.name
        shutil.copyfile(lib, copy)
        got = TvmLibrary(copy, target).run(list(feeds.values()))
    worst = max(rel_error(g, w) for g, w in zip(got, want))
    if worst > 1e-4:
        raise RuntimeError(f"TVM output differs from ORT (rel error {worst:.1e})")
    return worst
