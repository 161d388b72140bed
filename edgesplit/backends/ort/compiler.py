"""ONNX Runtime's compiler: the part's ONNX model runs as it is."""

from __future__ import annotations

from edgesplit.compile.job import Compiled, CompileJob
from edgesplit.device.spec import Backend, Processor


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
