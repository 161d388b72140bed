"""The compiler table: what each backend turns an extracted part into, keyed by backend name.

:func:`edgesplit.compile.api.compile_bundle` writes every part's ONNX model into the bundle, then
hands the part to ``COMPILERS[part.backend]``, which returns the artifact that runs it. A new
backend adds one line here (and one in ``device_schema.BACKENDS``, ``profile/backends.py`` and
``runtime/backends.py``); tests may add an entry at run time and remove it after.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgesplit.compile.split import PartModel
from edgesplit.compile.tune import Progress, TuneOptions
from edgesplit.compile.tvm_build import build_library, check_library
from edgesplit.cpu import ort_session_options
from edgesplit.device import Backend, Processor
from edgesplit.errors import CompileError
from edgesplit.model.graph import ModelGraph
from edgesplit.precision import DEFAULT_CALIBRATION_METHOD
from edgesplit.profile.tvm import runs_on_this_machine


@dataclass(frozen=True)
class CompileJob:
    """One part to compile.

    Attributes:
        bundle_dir: The bundle being written (artifacts go under ``parts/``).
        onnx_file: The part's ONNX model, already written, relative to ``bundle_dir``.
        max_error: The part's largest relative error against the whole model (ORT, checked).
        calibration_data: What reduced-precision parts are calibrated on (the plan's
            ``--calibration-data``; None: photographs or synthetic, see ``calibration_data``).
        calibration_method: How their activation ranges are found (the plan's
            ``--calibration-method``).
        tune_trials, tune: Tuning asked for (a total budget, or per-kernel options); TVM parts
            are tuned on their processor (its thread count and cores) before they are built.
    """

    part: PartModel
    graph: ModelGraph
    bundle_dir: Path
    onnx_file: str
    max_error: float
    tune_trials: int = 0
    calibration_data: str | None = None
    calibration_method: str = DEFAULT_CALIBRATION_METHOD
    tune: TuneOptions | None = None
    progress: Progress | None = None


@dataclass(frozen=True)
class Compiled:
    """What runs a part: its backend (which picks the executor), file and settings.

    Attributes:
        backend: Usually the part's own; another when the compiler fell back (TVM to ORT).
        warning: A line for the manifest's notes (a fallback, say), or None.
    """

    backend: str
    file: str
    provider: str = "CPUExecutionProvider"
    provider_options: Mapping[str, Any] = field(default_factory=dict)
    target: Mapping[str, Any] | None = None
    note: str = ""
    warning: str | None = None


class Compiler(Protocol):
    """Turns one extracted part into an artifact in the bundle.

    Contract: writes only under ``job.bundle_dir / "parts"``; raises :class:`CompileError` for a
    problem the user must fix (a missing toolchain), and falls back rather than fail where the
    part can still run another way (the result then says so in ``warning``).
    """

    def compile(self, job: CompileJob, processor: Processor, backend: Backend) -> Compiled: ...


class OrtCompiler:
    """ONNX Runtime runs the part's ONNX model as it is, with the backend's execution provider."""

    def compile(self, job: CompileJob, processor: Processor, backend: Backend) -> Compiled:
        return Compiled(
            backend.key,
            job.onnx_file,
            backend.provider,
            dict(backend.options),
            note=f"max rel error vs whole model {job.max_error:.1e}",
        )


class TvmCompiler:
    """A shared library built with TVM for the backend's target, checked against ORT where it runs
    here. A part TVM cannot import or build runs on ORT instead (CPU provider), with a note."""

    def compile(self, job: CompileJob, processor: Processor, backend: Backend) -> Compiled:
        target = dict(backend.target or {"kind": "llvm"})
        name = job.part.name
        file_rel = f"parts/{name}.so"
        lib = job.bundle_dir / file_rel
        try:
            t0 = time.perf_counter()
            info = build_library(
                job.part.model,
                target,
                lib,
                tune_trials=job.tune_trials,
                tune=replace(job.tune, threads=processor.threads, cores=processor.cores)
                if job.tune
                else None,
                threads=processor.threads,
                progress=job.progress,
            )
            note = f"tvm build {time.perf_counter() - t0:.1f}s" + (
                "" if "kept" not in info else " (kept from a build before)"
            )
            if info.get("cuda_kernels") == "source":
                note += "; CUDA kernels as source, compiled (NVRTC) where the part loads"
            if runs_on_this_machine(target):
                note += f"; max rel error vs ORT {_check(lib, target, job):.1e}"
        except CompileError:
            raise
        except Exception as e:  # noqa: BLE001 - TVM import/build failures fall back to ORT
            reason = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
            lib.unlink(missing_ok=True)
            return Compiled(
                "ort",
                job.onnx_file,
                note=f"TVM failed: {reason}",
                warning=f"part {name}: TVM failed ({reason}); runs on ORT instead",
            )
        return Compiled("tvm", file_rel, target=target, note=note)


def _check(lib: Path, target: Mapping[str, Any], job: CompileJob) -> float:
    """The library's largest error against ORT on the part's reference inputs."""
    import onnxruntime as ort

    from edgesplit.model.feeds import random_tensor

    rng = np.random.default_rng(0)
    feeds = {t: random_tensor(job.graph.tensors[t], rng) for t in job.part.inputs}
    sess = ort.InferenceSession(
        job.part.model.SerializeToString(),
        ort_session_options(None, None),
        providers=["CPUExecutionProvider"],
    )
    return check_library(lib, target, feeds, sess.run(list(job.part.outputs), feeds))


def _reduced() -> Compiler:
    from edgesplit.compile.quantize import ReducedPrecisionCompiler  # imports this module

    return ReducedPrecisionCompiler()


COMPILERS: dict[str, Compiler] = {
    "ort": OrtCompiler(),
    "tvm": TvmCompiler(),
    "ort-int8": _reduced(),
    "ort-fp16": _reduced(),
}
