"""The profiler table: how each backend is measured on this machine, keyed by backend name.

:func:`edgesplit.profile.run.profile_model` looks every (processor, backend) pair up here; a
backend with no entry, or whose profiler says it cannot measure here, gets roofline predictions.
A new backend adds one line (and one in ``device/schema.py: BACKENDS``, ``compile/backends.py`` and
``runtime/backends.py``); tests may add an entry at run time and remove it after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from edgesplit.backends.ort.profile import OrtProfiler
from edgesplit.backends.ort.quantized import OrtQuantizedProfiler
from edgesplit.backends.tvm.profile import TvmProfiler
from edgesplit.util import Progress

if TYPE_CHECKING:
    from edgesplit.device.spec import Backend, Processor
    from edgesplit.model.graph import ModelGraph
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.profile.store import ProcessorProfile


@dataclass(frozen=True)
class ProfileTask:
    """One (processor, backend) pair of a local device to measure: what a :class:`Profiler` is
    handed.

    Attributes:
        graph: The model, its nodes named as the profile keys them.
        processor, backend: The pair.
        options: How many timed and untimed runs (a profiler may scale them to its cost).
        progress: Told ``(label, done, total)`` as the pair's nodes are measured.
    """

    graph: ModelGraph
    processor: Processor
    backend: Backend
    options: ProfileOptions
    progress: Progress | None = None


class Profiler(Protocol):
    """Measures one (processor, backend) pair of a local device.

    Contract: :meth:`profile` is called only when :meth:`unavailable` returned None, on a device
    whose processors are on this machine; it returns a ``ProcessorProfile`` with ``source``
    ``measured`` whose ``nodes`` cover every node it could run (the others in ``unsupported``
    with the reason), keyed by the ModelGraph's node names, and where it can, the part terms
    (``terms``, :mod:`edgesplit.profile.terms`).

    A profiler may also offer ``contention(task, others) -> {processor name: slowdown}``: the
    task's pair's slowdown while each of ``others`` (processor, backend) runs the whole model;
    :func:`edgesplit.profile.run.profile_pair` calls it where the device has other local
    processors.
    """

    def unavailable(self, backend: Backend) -> str | None:
        """None when this machine can measure ``backend``, else why not (one line)."""
        ...

    def profile(self, task: ProfileTask) -> ProcessorProfile: ...


PROFILERS: dict[str, Profiler] = {
    "ort": OrtProfiler(),
    "tvm": TvmProfiler(),
    "ort-int8": OrtQuantizedProfiler(),
    "ort-fp16": OrtQuantizedProfiler(),
}
