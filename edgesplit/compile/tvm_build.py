"""Compile a part with Apache TVM for its processor's target and export a shared library.

- host llvm: built and exported with the system compiler;
- cross targets (``mtriple`` not this machine's): exported with ``<triple>-gcc``; a missing cross
  toolchain is a clear error naming the package to install;
- cuda: TVM's default GPU pipeline (dlight schedules).
Optional MetaSchedule tuning uses a database cached per target and reused across runs.

:class:`TvmLibrary` runs a built library; the compiler's check (:func:`check_library`) and the
runtime's TVM executor both use it, so compile needs nothing from the runtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgesplit.compile.split import rel_error
from edgesplit.errors import CompileError

GPU_KINDS = ("cuda", "rocm", "metal", "vulkan", "opencl")  # target kinds with a device of their own

_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def host_arch() -> str:
    return _ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower())


def target_arch(target: Mapping[str, Any]) -> str:
    triple = target.get("mtriple")
    return _ARCH_ALIASES.get(triple.split("-")[0], triple.split("-")[0]) if triple else host_arch()


def runs_here(target: Mapping[str, Any]) -> bool:
    """True when code for ``target`` can run on this machine (for checks and profiling)."""
    return target.get("kind") in ("llvm", "c") and target_arch(target) == host_arch()


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
            f"target {json.dumps(dict(target))} needs the cross compiler {cc}, which is not installed "
            f"(on Debian/Ubuntu: apt-get install {pkg})"
        )
    return cc


def tuning_dir(target: Mapping[str, Any]) -> Path:
    """Where MetaSchedule's database for this target lives (reused by later compiles)."""
    root = Path(os.environ.get("EDGESPLIT_CACHE", Path.home() / ".cache" / "edgesplit"))
    key = hashlib.sha256(json.dumps(dict(target), sort_keys=True).encode()).hexdigest()[:16]
    return root / "tvm-tuning" / key


def build_library(
    model: onnx.ModelProto,
    target: Mapping[str, Any],
    out: Path,
    *,
    tune_trials: int = 0,
    use_database: bool = True,
) -> dict[str, Any]:
    """Import, (tune,) compile and export ``model`` as a shared library at ``out``.

    With ``use_database`` (the default), schedules tuned earlier for this target are applied even
    when ``tune_trials`` is 0. Returns facts for the manifest (target, tuning trials and database).
    Raises CompileError for a
    missing toolchain; any TVM import or build error propagates for the caller to fall back on.
    """
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    cc = cross_compiler(target)
    tgt_dict = dict(target)
    info: dict[str, Any] = {"target": tgt_dict, "tune_trials": tune_trials}
    with contextlib.redirect_stdout(io.StringIO()):
        mod = from_onnx(model, keep_params_in_input=False)
        tgt = tvm.target.Target(tgt_dict)
        if tune_trials > 0 or (use_database and (tuning_dir(target) / "database_workload.json").exists()):
            work = tuning_dir(target)
            work.mkdir(parents=True, exist_ok=True)
            if "num-cores" not in tgt_dict and tgt_dict.get("kind") == "llvm":
                tgt = tvm.target.Target({**tgt_dict, "num-cores": os.cpu_count() or 1})
            mod = relax.pipeline.static_shape_tuning_pipeline(
                total_trials=tune_trials,
                target=tgt,
                work_dir=str(work),
                max_trials_per_task=max(1, min(64, tune_trials)) if tune_trials else None,
            )(mod)
            info["tuning_database"] = str(work)
        ex = tvm.compile(mod, target=tgt)
    out.parent.mkdir(parents=True, exist_ok=True)
    if cc:
        ex.export_library(str(out), fcompile=_cross_fcompile(cc))
    else:
        ex.export_library(str(out))
    return info


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

        lib = tvm.runtime.load_module(str(path))
        kind = (target or {}).get("kind", "llvm")
        self.device = tvm.device(kind if kind in GPU_KINDS else "cpu", 0)
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
