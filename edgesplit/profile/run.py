"""Profile a model on a device: measure what is here, predict what is not.

For each processor of the device and each of its backends:
- a local processor (the spec says ``local: true``) is measured: ORT with its execution provider
  (when this ORT build has it), TVM where the target runs on this CPU;
- anything else gets roofline predictions from the spec, marked ``predicted``.
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Callable, Sequence

from edgesplit.device import Backend, DeviceSpec, Processor
from edgesplit.model.graph import ModelGraph
from edgesplit.profile.predict import predict
from edgesplit.profile.store import ProcessorProfile, Profile

Progress = Callable[[str, int, int], None]


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    out = {
        "python": platform.python_version(),
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    try:
        import tvm

        out["tvm"] = tvm.__version__
    except Exception:  # noqa: BLE001 - TVM is optional at run time on a device
        pass
    return out


def _measurable(device: DeviceSpec, proc: Processor, backend: Backend) -> str | None:
    """None when (proc, backend) can be measured here, else why not."""
    if not device.local or proc.is_remote:
        return "not on this machine"
    if backend.runtime == "ort":
        import onnxruntime as ort

        if backend.provider not in ort.get_available_providers():
            return f"this onnxruntime has no {backend.provider}"
        return None
    from edgesplit.profile.tvm import RUNNABLE_HERE

    kind = (backend.target or {}).get("kind")
    return None if kind in RUNNABLE_HERE else f"TVM target kind '{kind}' does not run here"


def profile_model(
    graph: ModelGraph,
    device: DeviceSpec,
    *,
    backends: Sequence[str] | None = None,
    processors: Sequence[str] | None = None,
    runs: int = 20,
    warmup: int = 5,
    progress: Progress | None = None,
    previous: Profile | None = None,
) -> Profile:
    """Profile ``graph`` on every processor and backend of ``device``.

    Args:
        backends: Only these runtimes (``ort``, ``tvm``); default all.
        processors: Only these processors; default all.
        runs: Timed runs per measurement (median and p90 are over these).
        warmup: Untimed runs first.
        progress: Called as ``progress(label, done, total)``.
        previous: Entries of an earlier profile of the same model to keep (``--resume``).
    """
    from edgesplit.profile.ort import profile_ort
    from edgesplit.profile.tvm import profile_tvm

    entries: list[ProcessorProfile] = []
    wanted = set(processors) if processors else None
    if wanted:
        for name in wanted:
            device.processor(name)  # raises on unknown names
    for proc in device.processors:
        if wanted and proc.name not in wanted:
            continue
        for backend in proc.backends:
            if backends and backend.runtime not in backends:
                continue
            if previous is not None and (kept := previous.entry(proc.name, backend.key)) is not None:
                entries.append(kept)
                continue
            why = _measurable(device, proc, backend)
            if why is not None:
                entries.append(predict(graph, proc, backend, device=device.name))
            elif backend.runtime == "ort":
                entries.append(profile_ort(graph, proc, backend, runs=runs, warmup=warmup, progress=progress))
            else:
                entries.append(profile_tvm(graph, proc, backend, runs=max(3, runs // 2), progress=progress))
    return Profile(
        model_sha256=graph.sha256,
        model_name=graph.name,
        device=device.name,
        input_shapes=graph.input_shapes(),
        entries=tuple(entries),
        energy="modelled",
        versions=versions(),
        host=platform.node(),
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )
