"""Executors run one part of a bundle: ORT with an execution provider, or a TVM library.

Contract: an executor is built on the thread that will call it (so thread affinity and the cgroup
of a processor's worker apply to the runtime's own threads too); ``run`` takes a dict holding at
least the part's inputs and returns a dict with exactly the part's outputs. The table that picks
one per part is :data:`edgesplit.runtime.backends.EXECUTORS`.

An executor may also offer ``run`` in three phases, which the Session then times apart:
``gather(feeds)`` (pick and convert the inputs), ``call(args)`` (the backend's run call) and
``collect(raw)`` (the outputs as a dict of numpy arrays); ``run`` is ``collect(call(gather(f)))``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from edgesplit.compile.bundle import PartArtifact, VerifiedBundle, as_verified
from edgesplit.compile.tvm_build import TvmLibrary
from edgesplit.cpu import ort_session_options
from edgesplit.errors import BundleError
from edgesplit.util import short


class Executor(Protocol):
    """Runs one part. Built and called on the processor's worker thread. An executor whose ``run``
    may be called from several threads at once (the offload server's compute threads) says so with
    ``thread_safe = True``; one that does not is called one request at a time there."""

    part: PartArtifact

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class OrtExecutor:
    """An ONNX Runtime session on the part's ONNX file with its provider and thread count.

    The model is loaded from the bytes checked against the manifest as they were read.
    """

    thread_safe = True  # ORT's InferenceSession.run may be called concurrently

    def __init__(
        self,
        part: PartArtifact,
        bundle: VerifiedBundle | Path,
        *,
        file: str | None = None,
        provider: str | None = None,
        options: Mapping | None = None,
        shares_processor: bool = False,
        profile_prefix: str | None = None,
        session_attrs: Mapping[str, object] | None = None,
    ):
        """``shares_processor`` when other parts run on the same processor: the session's threads
        then stop spinning after each run (see ``ort_session_options``). ``profile_prefix`` turns
        on ORT's profiler, writing there (see ``end_profiling``). ``session_attrs`` are
        ``SessionOptions`` attributes (a backend that runs ORT differently sets them)."""
        import onnxruntime as ort

        self.part = part
        throttled = bool(part.cpu_quota_pct) or bool(part.core_quotas)
        so = ort_session_options(
            part.threads, part.cores, spin=not shares_processor, throttled=throttled, **(session_attrs or {})
        )
        if profile_prefix is not None:
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        provider = provider or part.provider
        available = ort.get_available_providers()
        if provider not in available:
            raise BundleError(
                f"part {part.name}: this onnxruntime has no {provider} (has {', '.join(available)})"
            )
        providers: list = [(provider, dict(options if options is not None else part.provider_options))]
        if provider != "CPUExecutionProvider":
            providers.append(("CPUExecutionProvider", {}))
        bundle = as_verified(bundle)
        rel = file or part.onnx_file
        try:  # from the very bytes that were checked, never by path again
            self._sess = ort.InferenceSession(bundle.read(rel), so, providers=providers)
        except BundleError:
            raise
        except Exception as e:  # noqa: BLE001 - ORT's errors are bare RuntimeErrors
            raise BundleError(f"{bundle / rel}: ONNX Runtime cannot load it ({short(str(e), 200)})") from e
        check_io(part, bundle / rel, self._sess.get_inputs(), self._sess.get_outputs())
        self._outputs = [o.name for o in part.outputs]
        self._inputs = [i.name for i in part.inputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.collect(self.call(self.gather(feeds)))

    def gather(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: feeds[k] for k in self._inputs}

    def call(self, args: dict[str, np.ndarray]) -> list:
        return self._sess.run(self._outputs, args)

    def collect(self, raw: list) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, raw))

    def end_profiling(self) -> tuple[str, int] | None:
        """Stop ORT's profiler: (its JSON file, its start on the wall clock in ns), or None if off."""
        if not self._sess.get_session_options().enable_profiling:
            return None
        start_ns = self._sess.get_profiling_start_time_ns()
        return self._sess.end_profiling(), start_ns

    def close(self) -> None:
        self._sess = None


class TvmExecutor:
    """A TVM Relax VM over the part's compiled library, loaded from a checked private copy."""

    thread_safe = False  # a VM holds its call frames: one call at a time

    def __init__(
        self,
        part: PartArtifact,
        bundle: VerifiedBundle | Path,
        *,
        shares_processor: bool = False,
        profile_prefix: str | None = None,
    ):
        """``shares_processor``: other parts run on this processor, so TVM's pool threads must not
        spin after a call (``TVM_THREAD_POOL_SPIN_COUNT=0``, read once per process when the pool
        starts; it stops the pool stealing the core from the next part, ORT's or TVM's). TVM has no
        per-kernel profiler here, so ``profile_prefix`` does not apply."""
        self.part = part
        if shares_processor:
            os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        bundle = as_verified(bundle)
        # A checked private copy is what gets mapped: the bundle's own file could change after
        # the check, the copy cannot (and it is removed once loaded; the mapping stays).
        with bundle.private_copy(part.file) as copy:
            try:
                self._lib = TvmLibrary(copy, part.target)
            except LookupError as e:
                raise BundleError(f"part {part.name}: {e}") from e
            except Exception as e:  # noqa: BLE001 - TVM's errors are its own, or bare RuntimeErrors
                raise BundleError(f"{bundle / part.file}: TVM cannot load it ({short(str(e), 200)})") from e
        self._inputs = [i.name for i in part.inputs]
        self._outputs = [o.name for o in part.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.collect(self.call(self.gather(feeds)))

    def gather(self, feeds: Mapping[str, np.ndarray]) -> list:
        return self._lib.tensors([feeds[k] for k in self._inputs])

    def call(self, args: list):
        return self._lib.call(args)

    def collect(self, raw) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self._lib.outputs(raw)))

    def close(self) -> None:
        self._lib.close()


_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def check_io(part: PartArtifact, file: Path, inputs: list, outputs: list) -> None:
    """The manifest's inputs and outputs of ``part`` are those of the loaded model (names, dtypes,
    static dimensions): an edited manifest is a one-line error here, not ORT's at the first run.

    ``inputs``, ``outputs``: ORT's ``NodeArg`` lists (``name``, ``type``, ``shape``).
    """

    def check(specs, args, what: str) -> None:
        have = {a.name: a for a in args}
        for t in specs:
            a = have.get(t.name)
            if a is None:
                raise BundleError(
                    f"{file}: the manifest says part {part.name} has {what} {t.name!r:.60}, which the model "
                    f"lacks (it has {', '.join(have)})"
                )
            dtype = _ORT_DTYPES.get(a.type)
            dims = list(a.shape)
            fits = len(dims) == len(t.shape) and all(
                not isinstance(d, int) or d == s for d, s in zip(dims, t.shape)
            )
            if (dtype is not None and dtype != t.dtype) or not fits:
                raise BundleError(
                    f"{file}: the manifest says {what} {t.name!r:.60} of part {part.name} is {t.dtype} "
                    f"{list(t.shape)}, the model has {a.type} {dims}"
                )

    check(part.inputs, inputs, "input")
    check(part.outputs, outputs, "output")
    extra = sorted({a.name for a in inputs} - {t.name for t in part.inputs})
    if extra:
        raise BundleError(f"{file}: the model of part {part.name} also needs inputs {', '.join(extra)[:120]}")


def timed(fn: Callable[[], dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3
