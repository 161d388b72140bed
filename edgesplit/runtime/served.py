"""One bundle part as the offload server serves it: its ORT session, its specs, its checks."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgesplit.compile.bundle import PartArtifact
from edgesplit.errors import RunInputError
from edgesplit.runtime import oip


class ServedModel:
    """One part behind ``/v2/models/{name}``: its ORT session, specs and metadata."""

    def __init__(self, part: PartArtifact, bundle: Path, intra_op_threads: int | None):
        import onnxruntime as ort

        self.part = part
        self.name = part.name
        from edgesplit.cpu import ort_session_options

        # the server processor's threads, as planned
        so = ort_session_options(intra_op_threads or part.threads, None)
        available = ort.get_available_providers()
        # The part was planned for a server processor (a GPU, say); serve it with that provider
        # when this onnxruntime has it, else on the CPU, and say so.
        provider = part.provider if part.provider in available else "CPUExecutionProvider"
        self.note = (
            "" if provider == part.provider else f"{part.name}: no {part.provider} here, serving on CPU"
        )
        providers: list[Any] = [(provider, dict(part.provider_options) if provider == part.provider else {})]
        if provider != "CPUExecutionProvider":
            providers.append(("CPUExecutionProvider", {}))
        self.session = ort.InferenceSession(str(bundle / part.onnx_file), so, providers=providers)
        self.inputs = {t.name: t for t in part.inputs}
        self.output_names = [t.name for t in part.outputs]
        self.metadata = {
            "name": part.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [_spec_json(t) for t in part.inputs],
            "outputs": [_spec_json(t) for t in part.outputs],
        }

    def check(self, req: oip.InferRequest) -> dict[str, np.ndarray]:
        """The request's inputs, checked against the part's names, datatypes and shapes."""
        unknown = [n[:64] for n in req.inputs if n not in self.inputs]
        missing = [n for n in self.inputs if n not in req.inputs]
        if unknown or missing:
            raise RunInputError(
                f"model '{self.name}' takes inputs {', '.join(self.inputs)}"
                + (f"; unknown {', '.join(unknown[:8])}" if unknown else "")
                + (f"; missing {', '.join(missing)}" if missing else "")
            )
        for name, spec in self.inputs.items():
            arr = req.inputs[name]
            if arr.dtype != np.dtype(spec.dtype):
                raise RunInputError(
                    f"input '{name}': datatype {oip.oip_datatype(arr.dtype)}, "
                    f"expected {oip.oip_datatype(spec.dtype)}"
                )
            if tuple(arr.shape) != tuple(spec.shape):
                shape = list(arr.shape) if arr.ndim <= 8 else f"of {arr.ndim} dimensions"
                raise RunInputError(f"input '{name}': shape {shape}, expected {list(spec.shape)}")
        if req.outputs is not None:
            bad = [n[:64] for n in req.outputs if n not in self.output_names]
            if bad:
                raise RunInputError(
                    f"model '{self.name}' has no output {', '.join(bad[:8])} "
                    f"(has {', '.join(self.output_names)})"
                )
        return dict(req.inputs)

    def run(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> tuple[dict[str, np.ndarray], float]:
        """Outputs ``names`` for ``feeds``, and the compute time in ms (called on a compute thread)."""
        t0 = time.perf_counter()
        got = self.session.run(names, dict(feeds))
        return dict(zip(names, got)), (time.perf_counter() - t0) * 1e3


def _spec_json(t) -> dict[str, Any]:
    return {"name": t.name, "datatype": oip.oip_datatype(t.dtype), "shape": list(t.shape)}
