"""The compiler of reduced-precision backends (``ort-int8``, ``ort-fp16``): the part converted.

The part's fp32 ONNX model (already extracted and checked) is converted to the backend's precision
by :func:`edgesplit.precision.measure.part_model`'s converter with the whole model's calibration on
the plan's calibration data, the same parts the planner measured; the artifact is
``parts/<part>.<precision>.onnx``, float32 at its boundary, run by ONNX Runtime with the backend's
execution provider (QDQ models are what QNN's HTP and NNAPI take). Its accuracy against the fp32
part on held-out samples is in the note.
"""

from __future__ import annotations

import onnx

from edgesplit.compile.job import Compiled, CompileJob
from edgesplit.device.spec import Backend, Processor
from edgesplit.model.calibration_data import calibration_set
from edgesplit.precision.convert import calibrate, convert


class ReducedPrecisionCompiler:
    """Converts the part to ``backend.precision``; the fp32 ONNX file stays for fallbacks."""

    def compile(self, job: CompileJob, processor: Processor, backend: Backend) -> Compiled:
        method = job.settings.calibration_method
        data = calibration_set(job.graph, job.settings.calibration_data)
        int8 = backend.precision == "int8"
        ranges = calibrate(job.graph, data, method) if int8 else None
        model = convert(job.part.model, backend.precision, ranges)
        file_rel = f"parts/{job.part.name}.{backend.precision}.onnx"
        onnx.save(model, job.bundle_dir / file_rel)
        return Compiled(
            backend.key,
            file_rel,
            backend.provider,
            dict(backend.options),
            note=f"{backend.precision}, calibrated on {data.source} data ({data.sha256[:12]})"
            + (f" with {method}" if int8 else ""),
        )
