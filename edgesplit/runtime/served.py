"""One bundle part as the offload server serves it: what runs it, its specs, its checks.

A part whose artifact is its ONNX file runs in an ORT session here (batched when asked). A part
with an artifact of its own (a TVM library, an int8 or fp16 model) runs through the runtime's
executor table, as it would on a device, so the server computes what the plan priced: a TVM CUDA
part on the GPU, not its fp32 ONNX on the CPU. Where that artifact cannot run here, the part's ONNX
runs on the CPU instead, and :attr:`ServedModel.note` says why (``serve`` prints it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgesplit.bundle.format import PartArtifact, VerifiedBundle
from edgesplit.errors import BundleError, RunInputError
from edgesplit.runtime import oip
from edgesplit.runtime.served_decoder import LAST_LOGITS, DecoderServing, decoder_serving


class ServedModel:
    """One part behind ``/v2/models/{name}``: what runs it, its specs and metadata.

    Attributes:
        runs_on: What computes the part here: ``ort`` (its ONNX file in ORT) or the backend of its
            own artifact (``tvm``, ``ort-int8``, ...).
        note: Why the part runs otherwise than planned (no provider, an artifact that does not
            load here, unbatched), or "".
    """

    def __init__(
        self,
        part: PartArtifact,
        bundle: VerifiedBundle,
        intra_op_threads: int | None,
        max_batch: int = 1,
        name: str | None = None,
        max_cache_tokens: int | None = None,
    ):
        """Load the part; with ``max_batch > 1``, its batch-free form when it has one (see
        :mod:`edgesplit.bundle.batching`), else it is served unbatched and :attr:`note` says so.
        ``name``: the model's name on the server (default: the part's). A decoder with dynamic
        lengths is served for prefill and decode requests (:mod:`edgesplit.runtime.served_decoder`),
        its cache held to ``max_cache_tokens`` positions (default: the model's)."""
        self.part = part
        self.name = name or part.name
        self.max_batch, self.rows = 1, 0
        self.executor, notes = None, []
        self.decoder: DecoderServing | None = None
        if part.file != part.onnx_file:
            self.executor, why = _artifact_executor(part, bundle, intra_op_threads)
            notes += [why] if why else []
            if self.executor is not None and max_batch > 1:
                notes.append(
                    f"{part.name}: served unbatched: its {part.backend} artifact runs as compiled"
                )
        # one call at a time into an executor that is not thread-safe (a TVM VM keeps its frames)
        unsafe = self.executor is not None and not getattr(self.executor, "thread_safe", False)
        self._serial = threading.Lock() if unsafe else None
        if self.executor is None:
            notes += self._load_onnx(part, bundle, intra_op_threads, max_batch)
            meta = self.session.get_modelmeta().custom_metadata_map
            self.decoder = decoder_serving(part, meta, max_cache_tokens)
        self.runs_on = part.backend if self.executor is not None else "ort"
        self.note = "; ".join(notes)
        self.inputs = {t.name: t for t in part.inputs}
        self.output_names = [t.name for t in part.outputs]
        # outputs a request may ask for beyond the part's own (not sent unless asked)
        self.extra_outputs = [LAST_LOGITS] if self.decoder else []
        self.metadata = {
            "name": self.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx"
            if self.executor is None
            else f"edgesplit_{part.backend}",
            "inputs": [_spec_json(t) for t in part.inputs],
            "outputs": [_spec_json(t) for t in part.outputs],
        }
        if self.decoder:
            self.metadata["outputs"].append(
                {"name": LAST_LOGITS, "datatype": "FP32", "shape": [-1, self.decoder.vocab_size]}
            )

    def _load_onnx(
        self,
        part: PartArtifact,
        bundle: VerifiedBundle,
        intra_op_threads: int | None,
        max_batch: int,
    ) -> list[str]:
        """An ORT session on the part's ONNX file (batch-free with ``max_batch > 1`` where it can
        be); returns the notes."""
        import onnxruntime as ort

        from edgesplit.device.cpu import ort_session_options

        # the server processor's threads, as planned. A batching server runs batches large
        # enough for ORT to use its pool; several compute threads then share the cores, and an
        # idle pool's spinning would steal them from the next batch (see ort_session_options).
        so = ort_session_options(intra_op_threads or part.threads, None, spin=max_batch <= 1)
        available = ort.get_available_providers()
        # The part was planned for a server processor (a GPU, say); serve it with that provider
        # when this onnxruntime has it, else on the CPU, and say so.
        provider = part.provider if part.provider in available else "CPUExecutionProvider"
        notes = (
            []
            if provider == part.provider
            else [f"{part.name}: no {part.provider} here, serving on CPU"]
        )
        providers: list[Any] = [
            (provider, dict(part.provider_options) if provider == part.provider else {})
        ]
        if provider != "CPUExecutionProvider":
            providers.append(("CPUExecutionProvider", {}))
        # from the bytes checked against the manifest as they were read
        onnx_bytes = bundle.read(part.onnx_file)
        if max_batch > 1 and decoder_serving(part, {}, None) is not None:
            notes.append(f"{part.name}: served unbatched: a decoder's requests differ in length")
        elif max_batch > 1:
            from edgesplit.bundle.batching import free_batch

            found = free_batch(onnx_bytes, part.inputs, part.outputs)
            if found.onnx_bytes is not None:
                onnx_bytes, self.max_batch, self.rows = found.onnx_bytes, max_batch, found.rows
            else:
                notes.append(f"{part.name}: served unbatched: {found.reason}")
        self.session = ort.InferenceSession(onnx_bytes, so, providers=providers)
        return notes

    def check(self, req: oip.InferRequest) -> dict[str, np.ndarray]:
        """The request's inputs, checked against the part's names, datatypes and shapes."""
        self._check_names(list(req.inputs))
        for name, arr in req.inputs.items():
            self._check_tensor(name, arr.dtype, arr.shape)
        if self.decoder is not None:
            self.decoder.check_values(req.inputs)
        if req.outputs is not None:
            known = self.output_names + self.extra_outputs
            bad = [n[:64] for n in req.outputs if n not in known]
            if bad:
                raise RunInputError(
                    f"model '{self.name}' has no output {', '.join(bad[:8])} "
                    f"(has {', '.join(known)})"
                )
        return dict(req.inputs)

    def check_declared(self, header: memoryview, binary_nbytes: int | None) -> int:
        """Check what a binary request's JSON header declares, before its tensors are read.

        ``binary_nbytes`` is what the body holds after the header (None: not known, chunked); the
        tensors declared must fill it. Returns the bytes of binary tensors declared.
        """
        declared = oip.declared_inputs(header)
        self._check_names([d.name for d in declared])
        for d in declared:
            self._check_tensor(d.name, d.dtype, d.shape)
        if self.decoder is not None:
            self.decoder.check_shapes({d.name: d.shape for d in declared})
        total = sum(d.binary_nbytes or 0 for d in declared)
        if binary_nbytes is None:
            return total
        if total > binary_nbytes:
            raise RunInputError(
                f"binary data runs past the end of the body ({total} bytes declared, "
                f"{binary_nbytes} sent)"
            )
        if total < binary_nbytes:
            raise RunInputError(
                f"the body holds {binary_nbytes - total} bytes beyond its header and binary tensors"
            )
        return total

    def _check_names(self, names: list[str]) -> None:
        unknown = [n[:64] for n in names if n not in self.inputs]
        missing = [n for n in self.inputs if n not in names]
        if unknown or missing:
            raise RunInputError(
                f"model '{self.name}' takes inputs {', '.join(self.inputs)}"
                + (f"; unknown {', '.join(unknown[:8])}" if unknown else "")
                + (f"; missing {', '.join(missing)}" if missing else "")
            )

    def _check_tensor(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        spec = self.inputs[name]
        if dtype != np.dtype(spec.dtype):
            raise RunInputError(
                f"input '{name}': datatype {oip.oip_datatype(dtype)}, expected "
                f"{oip.oip_datatype(spec.dtype)}"
            )
        if not spec.fits(shape):
            got = list(shape) if len(shape) <= 8 else f"of {len(shape)} dimensions"
            raise RunInputError(f"input '{name}': shape {got}, expected {spec.shown()}")

    def run(
        self, feeds: Mapping[str, np.ndarray], names: list[str]
    ) -> tuple[dict[str, np.ndarray], float]:
        """Outputs ``names`` for ``feeds``, and the compute time in ms (called on a compute
        thread)."""
        t0 = time.perf_counter()
        if self.executor is None and self.decoder is not None and LAST_LOGITS in names:
            # the last row of the logits (ORT computes them all: the graph's head runs per token)
            ask = list(dict.fromkeys("logits" if n == LAST_LOGITS else n for n in names))
            full = dict(zip(ask, self.session.run(ask, dict(feeds))))
            full[LAST_LOGITS] = np.ascontiguousarray(full["logits"][:, -1, :])
            got = {n: full[n] for n in names}
        elif self.executor is None:
            got = dict(zip(names, self.session.run(names, dict(feeds))))
        else:
            with self._serial or contextlib.nullcontext():
                out = self.executor.run(feeds)
            got = {n: out[n] for n in names}
        return got, (time.perf_counter() - t0) * 1e3

    def run_batch(
        self, feeds: Sequence[Mapping[str, np.ndarray]], names: Sequence[list[str]]
    ) -> list[tuple[dict[str, np.ndarray], float]]:
        """Each request's outputs from one run on the requests stacked along the first dimension,
        and the batch's compute time in ms (called on a compute thread; needs :attr:`max_batch` >
        1)."""
        if not 1 <= len(feeds) <= self.max_batch:
            raise ValueError(
                f"{self.name}: a batch of {len(feeds)} requests (at most {self.max_batch})"
            )
        wanted = list(dict.fromkeys(n for ns in names for n in ns))
        stacked = {k: np.concatenate([f[k] for f in feeds]) for k in self.inputs}
        t0 = time.perf_counter()
        got = dict(zip(wanted, self.session.run(wanted, stacked)))
        ms = (time.perf_counter() - t0) * 1e3
        k = len(feeds)
        split = {n: np.split(v, k) for n, v in got.items()}  # rows of each output: k equal slices
        return [({n: split[n][i] for n in ns}, ms) for i, ns in enumerate(names)]


def _spec_json(t) -> dict[str, Any]:
    return {"name": t.name, "datatype": oip.oip_datatype(t.dtype), "shape": list(t.shape)}


def _artifact_executor(part: PartArtifact, bundle: VerifiedBundle, intra_op_threads: int | None):
    """(the executor of the part's own artifact, by the runtime's table, or None; why not).

    The part runs here as a local part of the server: its provider where this onnxruntime has it
    (else the CPU's, said), the server's thread count, no core list (the spec's cores are the
    planned machine's, as for ORT parts)."""
    import onnxruntime as ort

    from edgesplit.runtime.backends import EXECUTORS

    factory = EXECUTORS.get(part.backend)
    fallback = "serving its ONNX file on the CPU with ORT"
    if factory is None:
        return None, f"{part.name}: no executor for backend '{part.backend}' here: {fallback}"
    notes = []
    local = dataclasses.replace(
        part, remote=False, cores=None, threads=intra_op_threads or part.threads
    )
    if part.provider and part.provider not in ort.get_available_providers():
        local = dataclasses.replace(local, provider="CPUExecutionProvider", provider_options={})
        notes.append(
            f"{part.name}: no {part.provider} here, its {part.backend} artifact runs on CPU"
        )
    try:
        executor = factory(local, bundle)
    except BundleError as e:
        return (
            None,
            f"{part.name}: its {part.backend} artifact does not load here ({e}): {fallback}",
        )
    return executor, "; ".join(notes)
