"""Executors run one part of a bundle: ORT with an execution provider, or a TVM library.

Contract: an executor is built on the thread that will call it (so thread affinity and the cgroup
of a processor's worker apply to the runtime's own threads too); ``run`` takes a dict holding at
least the part's inputs and returns a dict with exactly the part's outputs.

An executor may also offer ``run`` in three phases, which the Session then times apart:
``gather(feeds)`` (pick and convert the inputs), ``call(args)`` (the backend's run call) and
``collect(raw)`` (the outputs as a dict of numpy arrays); ``run`` is ``collect(call(gather(f)))``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from edgesplit.compile.bundle import PartArtifact
from edgesplit.cpu import ort_session_options
from edgesplit.errors import BundleError


class Executor(Protocol):
    """Runs one part. Built and called on the processor's worker thread."""

    part: PartArtifact

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class OrtExecutor:
    """An ONNX Runtime session on the part's ONNX file with its provider and thread count."""

    def __init__(
        self,
        part: PartArtifact,
        bundle: Path,
        *,
        file: str | None = None,
        provider: str | None = None,
        options: Mapping | None = None,
        spin: bool = True,
        profile_prefix: str | None = None,
    ):
        """``spin=False`` when other sessions share the processor (see ``ort_session_options``);
        ``profile_prefix`` turns on ORT's profiler, writing there (see ``end_profiling``)."""
        import onnxruntime as ort

        self.part = part
        so = ort_session_options(part.threads, part.cores, spin=spin)
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
        self._sess = ort.InferenceSession(str(bundle / (file or part.onnx_file)), so, providers=providers)
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
    """A TVM Relax VM over the part's compiled library (checksum verified by open_bundle)."""

    def __init__(self, part: PartArtifact, bundle: Path):
        import tvm
        from tvm import relax

        self.part = part
        lib = tvm.runtime.load_module(str(bundle / part.file))
        kind = (part.target or {}).get("kind", "llvm")
        self._dev = tvm.device(kind if kind in ("cuda", "rocm", "metal", "vulkan", "opencl") else "cpu", 0)
        if not self._dev.exist:
            raise BundleError(f"part {part.name}: its {kind} device is not present on this machine")
        self._vm = relax.VirtualMachine(lib, self._dev)
        self._tensor = tvm.runtime.tensor
        self._inputs = [i.name for i in part.inputs]
        self._outputs = [o.name for o in part.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.collect(self.call(self.gather(feeds)))

    def gather(self, feeds: Mapping[str, np.ndarray]) -> list:
        return [self._tensor(np.ascontiguousarray(feeds[k]), self._dev) for k in self._inputs]

    def call(self, args: list):
        return self._vm["main"](*args)

    def collect(self, raw) -> dict[str, np.ndarray]:
        values = [raw] if hasattr(raw, "numpy") else list(raw)
        return {name: v.numpy() for name, v in zip(self._outputs, values)}

    def close(self) -> None:
        self._vm = None


ExecutorFactory = Callable[..., Executor]


def _remote_executor(part: PartArtifact, bundle: Path, **options) -> Executor:
    from edgesplit.runtime.remote import RemoteExecutor  # imported on use: it builds on this module

    return RemoteExecutor(part, bundle, **options)


# Explicit registry: backend name -> factory(part, bundle_dir, **options). "remote" runs parts
# with remote=True (edgesplit.runtime.remote: OIP v2 client with a local fallback).
EXECUTORS: dict[str, ExecutorFactory] = {"ort": OrtExecutor, "tvm": TvmExecutor, "remote": _remote_executor}


def make_executor(part: PartArtifact, bundle: Path, **options) -> Executor:
    factory = EXECUTORS.get("remote" if part.remote else part.backend)
    if factory is None:
        raise BundleError(f"part {part.name}: no executor for backend '{part.backend}'")
    return factory(part, bundle, **options)


def timed(fn: Callable[[], dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3
