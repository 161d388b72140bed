"""TVM's compiler: a shared library built for the backend's target, checked against ORT."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgesplit.backends.tvm.build import build_library, check_library
from edgesplit.backends.tvm.profile import runs_on_this_machine
from edgesplit.compile.job import Compiled, CompileJob
from edgesplit.device.cpu import ort_session_options
from edgesplit.device.spec import Backend, Processor
from edgesplit.errors import CompileError


class TvmCompiler:
    """A shared library built with TVM for the backend's target, checked against ORT where it runs
    here. A part TVM cannot import or build runs on ORT instead (CPU provider), with a note."""

    def compile(self, job: CompileJob, processor: Processor, backend: Backend) -> Compiled:
        target = dict(backend.target or {"kind": "llvm"})
        name = job.part.name
        file_rel = f"parts/{name}.so"
        lib = job.bundle_dir / file_rel
        settings = job.settings
        try:
            t0 = time.perf_counter()
            info = build_library(
                job.part.model,
                target,
                lib,
                tune_trials=settings.tune_trials,
                tune=replace(settings.tune, threads=processor.threads, cores=processor.cores)
                if settings.tune
                else None,
                threads=processor.threads,
                progress=settings.progress,
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
