"""The pipeline context: one place that turns what the user gave into a checked :class:`Problem`.

What a plan is made from arrives in many forms: a model as a :class:`ModelGraph` or a path (str or
``os.PathLike``); a device and a server as a :class:`DeviceSpec`, a name or a path; a link as a
preset name or a :class:`NetworkLink`, with ``--bandwidth-mbps`` / ``--rtt-ms`` overrides; a
profile as a :class:`Profile`, a path, or nothing (then it is measured here where the device is
local, and predicted elsewhere); pins as ``NODE=PROC`` strings or a mapping; an objective name
and an SLO. :func:`resolve` turns all of these into one :class:`Problem` and checks them once,
with one-line errors; every entry point comes through it, so they cannot drift apart:

- :func:`partition` (the Python API) and :func:`edgesplit.workflows.deploy.deploy`;
- the ``partition``, ``deploy`` and ``compile`` commands;
- the bandwidth sweep (:func:`problem_from_plan` loads a plan's problem again);
- :func:`edgesplit.workflows.compile.compile_bundle` (:func:`as_plan`, :func:`plan_device`).

Layering: this module sits after ``optimize/`` (it builds the optimiser's :class:`Problem` and
checks the objective against its table) and before ``compile/``; ``optimize/`` stays pure because
it never loads anything itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from edgesplit.device.spec import DeviceSpec, NetworkLink, load_device, network_link
from edgesplit.errors import PlanError
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.accuracy import AccuracyCheck
from edgesplit.optimize.costs import pin_indices
from edgesplit.optimize.load import ServerLoad
from edgesplit.optimize.objectives import objective as objective_named
from edgesplit.optimize.plan import Plan, load_plan
from edgesplit.optimize.planner import solve_plan
from edgesplit.optimize.problem import Problem, combined
from edgesplit.precision import CALIBRATION_METHODS, recorded_calibration
from edgesplit.precision.metrics import DEFAULT_BUDGET, AccuracyBudget
from edgesplit.profile.predict import complete_profile
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import Profile, load_profile
from edgesplit.util import Progress, check_number, short

if TYPE_CHECKING:
    import numpy as np

ModelLike = ModelGraph | str | os.PathLike
SpecLike = DeviceSpec | str | os.PathLike

__all__ = [
    "Choices",
    "Problem",
    "as_plan",
    "check_choices",
    "load_graph",
    "parse_pins",
    "partition",
    "plan_device",
    "problem_from_plan",
    "resolve",
    "resolve_link",
    "with_server_profile",
]


@dataclass(frozen=True)
class Choices:
    """What the user chose for a plan, before anything is loaded; :func:`resolve` checks it.

    Attributes:
        objective: A name from :data:`edgesplit.optimize.objectives.OBJECTIVES` (``latency``,
            ``latency_sequential``, ``energy``, ``throughput``, ``pareto``).
        slo_ms: Latency limit (for ``energy`` and ``pareto``; checked for every objective).
        profile: A :class:`Profile` or its file; entries it lacks are predicted. None: measure the
            device's local processors (with ``profiling``) and predict the rest.
        server: A server spec (object, name or path) whose processors may take parts.
        server_profile: A profile of the model measured on the server (``edgesplit profile MODEL
            --device SERVER --here`` run there, or ``--remote`` to it), a :class:`Profile` or its
            file: the server's processors are priced with it instead of the spec's roofline. Only
            with a server. A plan records the file (not an object), and :func:`problem_from_plan`
            merges it again.
        link: A preset from ``devices/links.yaml`` or a :class:`NetworkLink`; Wi-Fi when a server
            is given without one. Only with a server, as are the two overrides.
        bandwidth_mbps, rtt_ms: Override the link's up and down rate, and its round-trip time.
        pins: ``node -> processor`` to force, as a mapping or ``NODE=PROC`` strings.
        input_shapes: Static shapes for dynamic inputs (when the model is a path).
        input_values: Sample values for inputs whose values decide shapes (when the model is a
            path): an ``Expand`` whose shape is an input. Their shapes count as given shapes, and
            the model is run on them wherever it is run on made-up data.
        profiling: How to measure when no profile is given (default :class:`ProfileOptions`).
        server_load: Devices sharing the server at once (``--server-load N``): server parts are
            priced with the queueing delay of N devices in a closed loop
            (:mod:`edgesplit.optimize.load`). Only with a server.
        server_slots: Requests the server computes at once, for ``server_load`` (default 1).
        accuracy: The budget int8 and fp16 parts must meet, measured against fp32 on held-out
            calibration samples (default :data:`~edgesplit.precision.metrics.DEFAULT_BUDGET`).
        calibration_data: An ``.npz`` or a folder of ``.npy`` samples to calibrate and measure
            with (default: photographs for a vision model, else synthetic inputs).
        calibration_method: How int8 activation ranges are found, one of
            :data:`edgesplit.precision.CALIBRATION_METHODS` (default
            :data:`~edgesplit.precision.DEFAULT_CALIBRATION_METHOD`).
        split_operators: A latency plan may split operators between two processors at once
            (:mod:`edgesplit.optimize.split`).
    """

    objective: str = "latency"
    slo_ms: float | None = None
    profile: Profile | str | os.PathLike | None = None
    server: SpecLike | None = None
    server_profile: Profile | str | os.PathLike | None = None
    link: NetworkLink | str | None = None
    bandwidth_mbps: float | None = None
    rtt_ms: float | None = None
    pins: Mapping[str, str] | Iterable[str] | None = None
    input_shapes: Mapping[str, Sequence[int]] | None = None
    input_values: Mapping[str, np.ndarray] | None = None
    profiling: ProfileOptions | None = None
    server_load: int | None = None
    server_slots: int = 1
    accuracy: AccuracyBudget | None = None
    calibration_data: str | os.PathLike | None = None
    calibration_method: str | None = None
    split_operators: bool = False


class ChoiceFields(TypedDict, total=False):
    """:class:`Choices` as keyword arguments (``partition(..., objective="energy")``): the same
    fields, each optional (``tests/test_house.py`` holds the two to the same names)."""

    objective: str
    slo_ms: float | None
    profile: Profile | str | os.PathLike | None
    server: SpecLike | None
    server_profile: Profile | str | os.PathLike | None
    link: NetworkLink | str | None
    bandwidth_mbps: float | None
    rtt_ms: float | None
    pins: Mapping[str, str] | Iterable[str] | None
    input_shapes: Mapping[str, Sequence[int]] | None
    input_values: Mapping[str, np.ndarray] | None
    profiling: ProfileOptions | None
    server_load: int | None
    server_slots: int
    accuracy: AccuracyBudget | None
    calibration_data: str | os.PathLike | None
    calibration_method: str | None
    split_operators: bool


def accuracy_check(
    graph: ModelGraph,
    budget: AccuracyBudget | None,
    calibration_data: str | os.PathLike | None,
    calibration_method: str | None = None,
    progress: Progress | None = None,
) -> AccuracyCheck:
    """The planner's accuracy check for ``graph``: the budget, and a measurer of plans that loads
    the calibration data only when a plan first has a reduced-precision part (``progress`` is told
    how far the measuring of a plan that misses the budget is)."""
    from edgesplit.precision.measure import PlanMeasurer

    measurer = PlanMeasurer(graph, calibration_data, calibration_method)
    return AccuracyCheck(budget or DEFAULT_BUDGET, measurer, measurer.describe, progress)


def load_graph(
    model: ModelLike,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    *,
    on_note: Callable[[str], None] | None = None,
) -> ModelGraph:
    """A loaded graph as it is, or an ONNX file (str or ``os.PathLike``) loaded with
    ``input_shapes`` and the sample ``input_values`` (see :func:`edgesplit.load_model`).

    ``on_note`` is told each of the graph's notes (what loading the model changed), as
    ``"MODEL: NOTE"``."""
    if isinstance(model, ModelGraph):
        graph = model
    else:
        from edgesplit.model.load import load_model

        graph = load_model(os.fspath(model), input_shapes, input_values=input_values)
    for note in graph.notes if on_note is not None else ():
        on_note(f"{model}: {note}")
    return graph


def load_spec(spec: SpecLike) -> DeviceSpec:
    """A spec as it is, or loaded by name or path."""
    return spec if isinstance(spec, DeviceSpec) else load_device(spec)


def _server(server: SpecLike | None) -> DeviceSpec | None:
    srv = load_spec(server) if server is not None else None
    if srv is not None and srv.kind != "server":
        raise PlanError(f"{srv.path or srv.name}: '{srv.name}' is a {srv.kind} spec, not a server")
    return srv


def resolve_link(
    server: DeviceSpec | None,
    link: NetworkLink | str | None = None,
    *,
    bandwidth_mbps: float | None = None,
    rtt_ms: float | None = None,
) -> NetworkLink | None:
    """The network link to ``server``: the preset (or link) with the overrides applied.

    Raises:
        PlanError: for a link or an override without a server (nothing would cross it).
        DeviceSpecError: for an unknown preset or an override out of range.
    """
    if server is None:
        if link is not None or bandwidth_mbps is not None or rtt_ms is not None:
            raise PlanError(
                "--link, --bandwidth-mbps and --rtt-ms need --server (a server to reach)"
            )
        return None
    return network_link(link, bandwidth_mbps=bandwidth_mbps, rtt_ms=rtt_ms)


def parse_pins(pins: Mapping[str, str] | Iterable[str] | None) -> dict[str, str]:
    """``node -> processor`` from a mapping, or from ``NODE=PROC`` strings (the CLI's ``--pin``).

    Node names may hold ``=``; processor names never do, so the last ``=`` splits. Unknown nodes
    and processors are reported (all at once) when the costs are built.

    Raises:
        PlanError: for a string that is not ``NODE=PROC``.
    """
    if pins is None:
        return {}
    if isinstance(pins, Mapping):
        return {str(k): str(v) for k, v in pins.items()}
    out: dict[str, str] = {}
    for v in [pins] if isinstance(pins, str) else pins:
        node, sep, proc = str(v).rpartition("=")
        if not sep or not node or not proc:
            raise PlanError(f"--pin '{v}' is not NODE=PROC")
        out[node] = proc
    return out


def _given_profile(
    graph: ModelGraph, given: Profile | str | os.PathLike
) -> tuple[Profile, str | None]:
    """A profile as it is, or read from its file; and that file. Raises PlanError (naming the
    file) for a profile of another model."""
    path = None if isinstance(given, Profile) else os.fspath(given)
    prof = given if isinstance(given, Profile) else load_profile(path)
    if prof.model_sha256 != graph.sha256:
        raise PlanError(
            f"{path + ': ' if path else ''}the profile is for model {prof.model_sha256[:12]} "
            f"({prof.model_name}), not {graph.sha256[:12]} ({graph.name})"
        )
    return prof, path


def _profile(
    graph: ModelGraph,
    full: DeviceSpec,
    given: Profile | str | os.PathLike | None,
    options: ProfileOptions | None,
    progress: Progress | None,
) -> tuple[Profile, str | None]:
    """The profile to plan with (not yet completed with predictions), and the file it came from."""
    if given is None:
        return profile_model(graph, full, options, progress=progress), None
    return _given_profile(graph, given)


def with_server_profile(
    graph: ModelGraph, profile: Profile, server: DeviceSpec, given: Profile | str | os.PathLike
) -> Profile:
    """``profile`` with the server's processors priced by ``given``, a profile of the model
    measured on the server: its entries, named as the device with the server names them
    (``<server>.<processor>``), replace whatever ``profile`` has for those processors.

    Raises:
        PlanError: naming the file, for a profile of another model, of another device than the
            server, or of a processor the server does not have.
    """
    sp, path = _given_profile(graph, given)
    where = f"{path}: " if path else "the server profile: "
    if sp.device != server.name:
        raise PlanError(
            f"{where}it is a profile of device '{sp.device}', not of the server '{server.name}'"
        )
    unknown = sorted({e.processor for e in sp.entries} - {p.name for p in server.processors})
    if unknown:
        raise PlanError(
            f"{where}processors {', '.join(unknown)} are not the server's "
            f"({', '.join(p.name for p in server.processors)})"
        )
    renamed = [replace(e, processor=f"{server.name}.{e.processor}") for e in sp.entries]
    taken = {e.processor for e in renamed}
    return replace(
        profile,
        entries=tuple(e for e in profile.entries if e.processor not in taken) + tuple(renamed),
    )


def check_choices(choices: Choices) -> dict[str, str]:
    """The checks of :func:`resolve` that need nothing loaded (objective, SLO, pins' form, a link
    without a server, backends to measure beside a profile); returns the pins parsed. Commands
    that load the model before :func:`resolve` (to print what loading changed) call it first.

    Raises:
        PlanError: as :func:`resolve` does for these.
    """
    c = choices
    objective_named(c.objective)
    if c.slo_ms is not None:
        check_number(c.slo_ms, "--slo-ms", PlanError)
        if not c.slo_ms > 0:
            raise PlanError(f"--slo-ms must be positive, got {c.slo_ms:g}")
    pins = parse_pins(c.pins)
    if c.calibration_method is not None and c.calibration_method not in CALIBRATION_METHODS:
        raise PlanError(
            f"unknown calibration method {short(c.calibration_method, 40)} "
            f"(methods: {', '.join(CALIBRATION_METHODS)})"
        )
    if c.server is None:
        resolve_link(None, c.link, bandwidth_mbps=c.bandwidth_mbps, rtt_ms=c.rtt_ms)
        if c.server_profile is not None:
            raise PlanError("--server-profile needs --server (the server it was measured on)")
    if c.profile is not None and c.profiling is not None and c.profiling.backends:
        raise PlanError(
            "--backend chooses what to measure, but --profile is given: nothing is measured"
        )
    if c.server_load is not None:
        if c.server is None:
            raise PlanError("--server-load needs --server (a server to share)")
        for flag, v in (("--server-load", c.server_load), ("--server-slots", c.server_slots)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"{flag} must be a whole number of at least 1, not {v!r}")
    return pins


def resolve(
    model: ModelLike,
    device: SpecLike = "host",
    choices: Choices | None = None,
    *,
    progress: Progress | None = None,
) -> Problem:
    """Load and check everything a plan is made from (see :class:`Choices`); measure if need be.

    Cheap checks (objective, SLO, pins' form, link without a server) come before anything is
    loaded, and pins naming an unknown node or processor before anything is measured.

    Raises:
        PlanError: an unknown objective, a non-positive SLO, a malformed pin, a link without a
            server, a server spec that is not a server, a profile of another model.
        DeviceSpecError, ModelLoadError, ProfileError: for specs, models and profiles that cannot
            be read (naming the file).
    """
    c = choices or Choices()
    pins = check_choices(c)
    graph = load_graph(model, c.input_shapes, c.input_values)
    dev = load_spec(device)
    srv = _server(c.server)
    link = resolve_link(srv, c.link, bandwidth_mbps=c.bandwidth_mbps, rtt_ms=c.rtt_ms)
    full = combined(dev, srv)
    pin_indices(graph, full.processors, pins)  # an unknown node or processor, before measuring
    prof, path = _profile(graph, full, c.profile, c.profiling, progress)
    server_path = None
    if srv is not None and c.server_profile is not None:
        # the plan records both files: its problem is made again by merging them again
        prof = with_server_profile(graph, prof, srv, c.server_profile)
        server_path = None if isinstance(c.server_profile, Profile) else os.fspath(c.server_profile)
    prof = complete_profile(graph, full, prof)
    load = ServerLoad(c.server_load, c.server_slots) if c.server_load is not None else None
    check = accuracy_check(graph, c.accuracy, c.calibration_data, c.calibration_method, progress)
    return Problem(
        graph,
        dev,
        prof,
        srv,
        link,
        c.objective,
        c.slo_ms,
        pins,
        path,
        server_load=load,
        accuracy=check,
        server_profile_path=server_path,
        split_operators=c.split_operators,
    )


def partition(
    model: ModelLike,
    device: SpecLike = "host",
    *,
    time_limit_s: float = 60.0,
    max_evals: int = 300,
    progress: Progress | None = None,
    **choices: Unpack[ChoiceFields],
) -> Plan:
    """Split a model over a device's processors (and a server's) for an objective.

    Args:
        model: A loaded :class:`ModelGraph` or the path of an ONNX file (str or ``os.PathLike``).
        device: A :class:`DeviceSpec` or a spec name / path.
        choices: The fields of :class:`Choices`: ``objective``, ``slo_ms``, ``profile``,
            ``server``, ``server_profile``, ``link``, ``bandwidth_mbps``, ``rtt_ms``, ``pins``,
            ``input_shapes``, ``input_values``, ``profiling``, ``server_load``, ``server_slots``,
            ``accuracy``, ``calibration_data``, ``calibration_method``. Without a profile, the local
            processors
            are measured and the rest predicted, as ``edgesplit partition`` does.

    Returns:
        The plan, with the baselines predicted by the same cost model.

    Raises:
        PlanError: see :func:`resolve`; also unknown processors or nodes in pins, ops no processor
            supports (all listed), an SLO that cannot be met (with the best latency).
    """
    problem = resolve(model, device, Choices(**choices), progress=progress)
    return solve_plan(problem, time_limit_s=time_limit_s, max_evals=max_evals)


def as_plan(plan: Plan | str | os.PathLike) -> Plan:
    """A plan as it is, or read from its JSON file (the API edge: paths become Plans here, once)."""
    return plan if isinstance(plan, Plan) else load_plan(plan)


def _recorded_spec(path: str, name: str) -> DeviceSpec:
    """The spec a plan names: its recorded file when it is still there, else by name."""
    return load_device(path if path and Path(path).is_file() else name)


def plan_device(plan: Plan, device: SpecLike | None = None) -> DeviceSpec:
    """The device a plan runs on, with its server's processors: ``device`` when given, else the
    spec file the plan was made with (``plan.device_path``), else the spec named ``plan.device``."""
    spec = (
        load_spec(device) if device is not None else _recorded_spec(plan.device_path, plan.device)
    )
    return combined(spec, _recorded_spec(plan.server_path, plan.server) if plan.server else None)


def _plan_link(plan: Plan) -> NetworkLink | str | None:
    return plan.link or None  # older plans name the preset


def _plan_load(plan: Plan) -> dict[str, int]:
    """The server load a plan was priced for (``predicted``'s ``server_devices``), as Choices
    fields."""
    devices = plan.predicted.server_devices
    if devices is None:
        return {}
    return {"server_load": int(devices), "server_slots": int(plan.predicted.server_slots or 1)}


def problem_from_plan(plan: Plan, graph: ModelGraph | None = None) -> Problem:
    """The problem a plan was made from, loaded again from what it records (the model as ``graph``
    when given: loaded with sample input values, say).

    Raises:
        PlanError: when the model file is gone or has another hash than the plan's.
    """
    if graph is None:
        if not Path(plan.model_path).is_file():
            raise PlanError(f"the plan's model {plan.model_path} is missing")
        graph = load_graph(plan.model_path, plan.input_shapes or None)
    if graph.sha256 != plan.model_sha256:
        raise PlanError(
            f"the plan is for model {plan.model_sha256[:12]}, but {graph.path} is "
            f"{graph.sha256[:12]} (re-run edgesplit partition)"
        )
    acc = plan.accuracy
    data, method = recorded_calibration(acc)
    choices = Choices(
        objective=plan.objective,
        slo_ms=plan.slo_ms,
        profile=plan.profile_path,
        server=_recorded_spec(plan.server_path, plan.server) if plan.server else None,
        server_profile=plan.server_profile_path if plan.server else None,  # merged again
        link=_plan_link(plan),
        pins=plan.pins,
        **_plan_load(plan),
        accuracy=acc.budget if acc is not None else None,
        calibration_data=data,
        calibration_method=method,
    )
    problem = resolve(graph, _recorded_spec(plan.device_path, plan.device), choices)
    if not plan.splits:
        return problem
    from edgesplit.optimize.split import for_plan

    split_graph, profile = for_plan(problem.graph, plan.splits, problem.profile)
    return replace(problem, graph=split_graph, profile=profile)
