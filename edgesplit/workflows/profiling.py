"""``profile`` to a file: a model's per-node costs measured here, over SSH, or on a fleet of hosts.

:func:`profile_to_file` is what ``edgesplit profile`` runs for one device and :func:`profile_hosts`
what it runs with ``--hosts``. Both check the request and read the model here first, so a bad
model or spec fails before anything is measured or sent anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesplit.errors import InputError
from edgesplit.workflows.feedback import SILENT, Feedback

if TYPE_CHECKING:
    from edgesplit.device.spec import DeviceSpec
    from edgesplit.model.graph import ModelGraph
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.profile.ssh import SshOptions
    from edgesplit.profile.store import Profile

__all__ = ["ProfileRequest", "ProfiledModel", "profile_hosts", "profile_to_file"]


@dataclass(frozen=True)
class ProfileRequest:
    """What to measure and where the profile goes.

    Attributes:
        output: The profile's file (default ``MODEL.DEVICE.profile.json``, ``MODEL.HOST...`` over
            SSH); for a fleet, the folder of one profile per host.
        options: Which processors and backends, and how many runs.
        resume: Keep the pairs an interrupted run saved (``OUTPUT.partial``); measure the rest.
        here: The device is this machine, although its spec is not marked local.
        remote: ``USER@HOST[:PORT]`` to profile on over SSH, reached with ``ssh``.
        input_shapes, input_values: ``--input-shape`` and ``--input`` parsed.
    """

    output: str | os.PathLike | None = None
    options: ProfileOptions | None = None
    resume: bool = False
    here: bool = False
    remote: str | None = None
    ssh: SshOptions | None = None
    input_shapes: dict | None = None
    input_values: dict | None = None


@dataclass(frozen=True)
class ProfiledModel:
    """A profile written: the model, its profile and file, the spec measured with (None over
    SSH), and why power rails were not used."""

    graph: ModelGraph
    profile: Profile
    path: Path
    spec: DeviceSpec | None
    rails_skipped: tuple[str, ...]


def _graph(
    model: str, request: ProfileRequest, on_note: Callable[[str], None] | None
) -> ModelGraph:
    from edgesplit.workflows.resolve import load_graph

    return load_graph(model, request.input_shapes, request.input_values, on_note=on_note)


def profile_to_file(
    model: str,
    device: str,
    request: ProfileRequest,
    *,
    feedback: Feedback = SILENT,
) -> ProfiledModel:
    """Profile ``model`` on ``device`` (here, or on ``request.remote``) and write the profile.

    Raises:
        InputError: for ``here`` with ``remote``.
        DeviceSpecError, ModelLoadError, ProfileError: naming the file at fault.
    """
    from edgesplit.device.spec import read_spec

    if request.here and request.remote:
        raise InputError("--here measures this machine; --remote and --hosts measure others")
    # a bad device spec fails before the model is read (that can take seconds)
    here = True if request.here else None
    spec = None if request.remote else read_spec(device).load(local=here)
    graph = _graph(model, request, feedback.on_note)  # validated first: a bad model never travels
    if request.remote:
        prof, out, skipped = _remote(model, graph, device, request, feedback.progress)
    else:
        prof, out, skipped = _local(graph, spec, request, feedback.progress)
    return ProfiledModel(graph, prof, out, spec, tuple(skipped))


def _remote(model, graph, device, request: ProfileRequest, progress):
    from edgesplit.profile.remote import RemoteOptions, profile_remote, remote_spec
    from edgesplit.profile.ssh import parse_target

    target = parse_target(request.remote)
    out = Path(request.output or f"{graph.name}.{target.host}.profile.json")
    plan: dict = {}

    def on_event(ev) -> None:
        if ev.get("event") == "plan":
            plan.update(ev)

    prof = profile_remote(
        model,
        target,
        RemoteOptions(request.ssh, remote_spec(device), request.resume),
        output=out,
        options=request.options,
        input_shapes=graph.input_shapes(),
        progress=progress,
        on_event=on_event,
    )
    return prof, out, plan.get("skipped", [])


def _local(graph, spec, request: ProfileRequest, progress):
    from edgesplit.profile.power import find_rails
    from edgesplit.profile.steps import load_partial, partial_path, profile_steps, save_partial

    out = Path(request.output or f"{graph.name}.{spec.name}.profile.json")
    part = partial_path(out)
    done = load_partial(part, graph.sha256, spec.name) if request.resume else []
    finished = list(done)

    def checkpoint(entry) -> None:
        finished.append(entry)
        save_partial(part, graph.sha256, graph.name, spec.name, graph.input_shapes(), finished)

    rails = find_rails()
    prof = profile_steps(
        graph, spec, request.options, progress=progress, done=done, on_entry=checkpoint, rails=rails
    )
    prof.save(out)
    part.unlink(missing_ok=True)
    return prof, out, list(rails.skipped)


def profile_hosts(
    model: str,
    fleet_file: str | os.PathLike,
    request: ProfileRequest,
    *,
    jobs: int | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> tuple[ModelGraph, list]:
    """Profile ``model`` on every host of a fleet file, in parallel, one profile per host in the
    folder ``request.output``; ``on_event(host, event)`` follows each host. Returns the model
    and each host's :class:`edgesplit.profile.fleet.HostResult`.

    Raises:
        InputError: for ``remote`` or ``here`` given too, or no output folder.
    """
    from edgesplit.profile.fleet import load_fleet, profile_fleet

    if request.remote:
        raise InputError("--remote and --hosts exclude each other")
    if request.here:
        raise InputError("--here measures this machine; --remote and --hosts measure others")
    graph = _graph(model, request, on_note)
    if not request.output:
        raise InputError("--hosts needs -o DIR: one profile per host goes there")
    fleet = load_fleet(fleet_file, request.ssh)
    for host in fleet.hosts if on_event is not None else ():
        on_event(host.name, {"event": "queued"})
    results = profile_fleet(
        model,
        fleet,
        request.output,
        options=request.options,
        input_shapes=graph.input_shapes(),
        jobs=jobs,
        resume=request.resume,
        on_event=on_event,
    )
    return graph, results
