"""ONNX Runtime's executor: a part's ONNX model in an InferenceSession with its provider."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edgesplit.bundle.format import PartArtifact, VerifiedBundle, as_verified
from edgesplit.device.cpu import ort_session_options
from edgesplit.errors import BundleError
from edgesplit.runtime.executors import check_io
from edgesplit.util import short


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
            part.threads,
            part.cores,
            spin=not shares_processor,
            throttled=throttled,
            **(session_attrs or {}),
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
        providers: list = [
            (provider, dict(options if options is not None else part.provider_options))
        ]
        if provider != "CPUExecutionProvider":
            providers.append(("CPUExecutionProvider", {}))
        bundle = as_verified(bundle)
        rel = file or part.onnx_file
        try:  # from the very bytes that were checked, never by path again
            self._sess = ort.InferenceSession(bundle.read(rel), so, providers=providers)
        except BundleError:
            raise
        except Exception as e:  # noqa: BLE001 - ORT's errors are bare RuntimeErrors
            raise BundleError(
                f"{bundle / rel}: ONNX Runtime cannot load it ({short(str(e), 200)})"
            ) from e
        check_io(part, bundle / rel, self._sess.get_inputs(), self._sess.get_outputs())
        # ORT's run refuses an input of another element type, rank or fixed dimension before it
        # computes anything (InferenceSession::ValidateInputs), and gather a missing one (the
        # binding's own run would start the graph without it): with every input dimension fixed
        # in the model, a caller may check a request after its run
        self.checks_inputs = all(
            isinstance(d, int) for a in self._sess.get_inputs() for d in a.shape
        )
        self.output_names = [o.name for o in part.outputs]
        self.input_names = [i.name for i in part.inputs]
        # run_binding(output names, feeds, None) -> arrays: the binding's own run, past the Python
        # wrapper's checks, on the CPU provider (which has no provider to fall back from); 20-30 us
        # a request here after an idle pause (the wrapper's three checks). It refuses an unknown
        # input name up front but runs the graph without a missing one (gather passes them all).
        binding = getattr(self._sess, "_sess", None)
        cpu_only = provider == "CPUExecutionProvider"
        self.run_binding = binding.run if cpu_only and hasattr(binding, "run") else self._sess.run
        # a caller may run run_binding itself in place of run (gather, call, collect), as the
        # Session's one-part path does, unless a subclass changed one of them
        self.direct_binding = all(
            getattr(type(self), m) is getattr(OrtExecutor, m)
            for m in ("run", "gather", "call", "collect")
        )

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.collect(self.call(self.gather(feeds)))

    def gather(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: feeds[k] for k in self.input_names}

    def call(self, args: dict[str, np.ndarray]) -> list:
        return self.run_binding(self.output_names, args, None)

    def collect(self, raw: list) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, raw))

    @property
    def ort_session(self):
        """The part's ``onnxruntime.InferenceSession`` (generation binds its cache through it)."""
        return self._sess

    def end_profiling(self) -> tuple[str, int] | None:
        """Stop ORT's profiler: (its JSON file, its start on the wall clock in ns), or None if
        off."""
        if not self._sess.get_session_options().enable_profiling:
            return None
        start_ns = self._sess.get_profiling_start_time_ns()
        return self._sess.end_profiling(), start_ns

    def close(self) -> None:
        """Let ONNX Runtime's session go (the binding's run held it too)."""
        self._sess = None
        self.run_binding = _closed


def _closed(*_args) -> list:
    raise BundleError("the part's ONNX Runtime session is closed")
