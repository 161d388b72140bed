"""What a backend's compiler is handed (:class:`CompileJob`, with the :class:`BuildSettings` every
part of a build shares), what it returns (:class:`Compiled`), and the contract it keeps
(:class:`Compiler`). The table of compilers is
:data:`edgesplit.compile.backends.COMPILERS`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edgesplit.backends.tvm.tune import Progress, TuneOptions
from edgesplit.compile.split import PartModel
from edgesplit.device.spec import Backend, Processor
from edgesplit.model.graph import ModelGraph
from edgesplit.precision import DEFAULT_CALIBRATION_METHOD


@dataclass(frozen=True)
class BuildSettings:
    """How every part of one bundle is compiled.

    Attributes:
        tune_trials, tune: Tuning asked for (a total budget, or per-kernel options); TVM parts
            are tuned on their processor (its thread count and cores) before they are built.
        calibration_data: What reduced-precision parts are calibrated on (the plan's
            ``--calibration-data``; None: photographs or synthetic, see ``calibration_data``).
        calibration_method: How their activation ranges are found (the plan's
            ``--calibration-method``).
        progress: Told how tuning goes.
    """

    tune_trials: int = 0
    tune: TuneOptions | None = None
    calibration_data: str | None = None
    calibration_method: str = DEFAULT_CALIBRATION_METHOD
    progress: Progress | None = None


@dataclass(frozen=True)
class CompileJob:
    """One part to compile.

    Attributes:
        bundle_dir: The bundle being written (artifacts go under ``parts/``).
        onnx_file: The part's ONNX model, already written, relative to ``bundle_dir``.
        max_error: The part's largest relative error against the whole model (ORT, checked).
        settings: What every part of the bundle is compiled with (tuning, calibration).
    """

    part: PartModel
    graph: ModelGraph
    bundle_dir: Path
    onnx_file: str
    max_error: float
    settings: BuildSettings


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
