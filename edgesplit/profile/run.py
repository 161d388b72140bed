"""Profile a model on a device: measure what is here, predict what is not.

For each processor of the device and each of its backends:
- a local processor (the spec says ``local: true``) is measured by the backend's profiler from
  the table in :mod:`edgesplit.profile.backends`, where that profiler can measure here (ORT with
  an execution provider this build has, TVM for a target that runs on this CPU);
- anything else gets roofline predictions from the spec, marked ``predicted``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import platform
from collections.abc import Iterator
from typing import TYPE_CHECKING

from edgesplit.device.spec import Backend, DeviceSpec, Processor, shares_cores
from edgesplit.errors import EdgesplitError, InputError
from edgesplit.limits import stage_limit
from edgesplit.model.feeds import run_failure
from edgesplit.model.graph import ModelGraph
from edgesplit.model.validate import ort_message
from edgesplit.profile.options import ProfileOptions
from edgesplit.profile.predict import predict
from edgesplit.profile.store import ProcessorProfile, Profile
from edgesplit.util import Progress

if TYPE_CHECKING:
    from edgesplit.profile.backends import ProfileTask


def versions() -> dict[str, str]:
    """Python's version and the installed versions of the runtimes, read without importing them
    (importing TVM takes seconds, and a profile of predictions only needs neither)."""
    from edgesplit.device.detect import module_versions

    found = module_versions(("onnx", "onnxruntime", "tvm"))
    return {
        "python": platform.python_version(),
        **{k: v for k, v in found.items() if v is not None},
    }


def selected(device: DeviceSpec, options: ProfileOptions) -> list[tuple[Processor, Backend]]:
    """The (processor, backend) pairs ``options`` asks for, in profile order.

    Raises:
        DeviceSpecError: for a processor the device does not have.
        InputError: for a backend none of the chosen processors offers (nothing would be measured
            for it, and the plan would rest on predictions without saying so).
    """
    for name in options.processors or ():
        device.processor(name)  # raises on unknown names
    procs = [p for p in device.processors if not options.processors or p.name in options.processors]
    offered = list(dict.fromkeys(b.key for p in procs for b in p.backends))
    missing = [b for b in options.backends or () if b not in offered]
    if missing:
        raise InputError(
            f"{device.name}: no processor offers backend '{missing[0]}' (its backends: "
            f"{', '.join(offered)})"
        )
    return [
        (p, b)
        for p in procs
        for b in p.backends
        if not options.backends or b.key in options.backends
    ]


def unavailable(device: DeviceSpec, processor: Processor, backend: Backend) -> str | None:
    """None when (processor, backend) can be measured here, else why not."""
    from edgesplit.profile.backends import PROFILERS

    if not device.local or processor.is_remote:
        return "not on this machine"
    profiler = PROFILERS.get(backend.key)
    if profiler is None:
        return f"no profiler for backend '{backend.key}'"
    return profiler.unavailable(backend)


def profile_pair(
    graph: ModelGraph,
    device: DeviceSpec,
    processor: Processor,
    backend: Backend,
    options: ProfileOptions,
    progress: Progress | None = None,
) -> ProcessorProfile:
    """Measure one pair with its backend's profiler, or predict it where it cannot be measured."""
    from edgesplit.profile.backends import PROFILERS, ProfileTask

    if unavailable(device, processor, backend) is not None:
        return predict(graph, processor, backend, device=device.name)
    profiler = PROFILERS[backend.key]
    task = ProfileTask(graph, processor, backend, options, progress)
    return with_contention(task, device, profiler.profile(task), profiler)


def with_contention(
    task: ProfileTask, device: DeviceSpec, entry: ProcessorProfile, profiler
) -> ProcessorProfile:
    """``entry`` with its pairwise contention measured, where its profiler can measure it: how much
    the task's pair slows down while each other local processor runs the whole model (on the same
    backend, where that processor has it and the model runs there whole)."""
    graph, processor, backend = task.graph, task.processor, task.backend
    measure = getattr(profiler, "contention", None)
    if measure is None or entry.terms is None or entry.whole_model_ms is None:
        return entry
    others = [
        (q, q.backend(backend.key))
        for q in device.processors
        if q.name != processor.name
        and not q.is_remote
        and not shares_cores(q, processor)  # a core group and its members never run at once
        and any(b.key == backend.key for b in q.backends)
        and all(q.supports(n.op_type) for n in graph.nodes)
    ]
    if not others:
        return entry
    factors = measure(task, others)
    return dataclasses.replace(entry, terms=dataclasses.replace(entry.terms, contention=factors))


def empty_profile(graph: ModelGraph, device: DeviceSpec) -> Profile:
    """A profile of ``graph`` on ``device`` with no entries yet: the metadata of a run made now."""
    return Profile(
        model_sha256=graph.sha256,
        model_name=graph.name,
        device=device.name,
        input_shapes=graph.input_shapes(),
        entries=(),
        versions=versions(),
        host=platform.node(),
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )


def profile_model(
    graph: ModelGraph,
    device: DeviceSpec,
    options: ProfileOptions | None = None,
    *,
    progress: Progress | None = None,
    previous: Profile | None = None,
) -> Profile:
    """Profile ``graph`` on every processor and backend of ``device`` that ``options`` selects.

    Args:
        options: Which pairs, how many runs (default :class:`ProfileOptions`).
        progress: Called as ``progress(label, done, total)``.
        previous: Entries of an earlier profile of the same model to keep (``--resume``).

    The processors' whole-model times are then leveled against one another
    (:func:`~edgesplit.profile.level.level`). It all runs under the ``profile`` stage's time limit
    (:mod:`edgesplit.limits`).

    Raises:
        RunInputError: a run failed on made-up inputs (it names them; give their values).
        StageTimeout: past the ``profile`` stage's time limit.
    """
    from edgesplit.profile.level import level

    opts = options or ProfileOptions()
    entries: list[ProcessorProfile] = []
    with profiling_stage(graph) as doing:
        for proc, backend in selected(device, opts):
            kept = previous.entry(proc.name, backend.key) if previous is not None else None
            doing[0] = f"profiling on {proc.name} ({backend.key})"
            entries.append(kept or profile_pair(graph, device, proc, backend, opts, progress))
        doing[0] = "profiling the whole model"
        leveled = level(graph, device, entries, opts.runs, progress)
    return dataclasses.replace(empty_profile(graph, device), entries=leveled)


@contextlib.contextmanager
def profiling_stage(graph: ModelGraph) -> Iterator[list[str]]:
    """The ``profile`` stage of ``graph``: under its time limit, and a run that fails (ORT raises
    bare errors) becomes the error that names the inputs made up (:func:`run_failure`). The caller
    keeps what it is doing in the list it gets (its one item), for that error."""
    doing = ["profiling"]
    with stage_limit("profile", graph.path):
        try:
            yield doing
        except EdgesplitError:
            raise
        except Exception as e:  # noqa: BLE001 - ORT's run errors are of its own bare types
            raise run_failure(graph, doing[0], ort_message(e)) from e
