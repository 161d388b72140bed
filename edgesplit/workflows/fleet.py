"""``edgesplit fleet plan``: read a fleet file, make each group's candidate plans, plan the fleet
together, and write a plan per group, the server's settings and the report, atomically.

Groups with the same model, spec, link and profile share one resolved problem and one set of
candidates (profiled or predicted once).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np

from edgesplit.errors import InputError
from edgesplit.fleet.price import Candidate, Group, Server
from edgesplit.fleet.spec import FleetError, FleetSpec, GroupSpec, load_fleet
from edgesplit.util import Progress, atomic_dir, dump_json, refuse_to_replace

OUT_MARKER = "fleet-report.json"


class FleetOptions(TypedDict, total=False):
    """How :func:`plan_fleet_file` plans (every key optional)."""

    max_candidates: int
    """Candidate plans kept per group (default 12)."""
    max_evals: int
    """Solver evaluations for a group's own energy and latency plans (default 150)."""
    exact_limit: int
    """Price every choice when there are at most this many (default 4096)."""
    force: bool
    """Replace an output folder that is not a fleet plan."""
    bundles: bool
    """Also compile each group's plan into ``groups/NAME/bundle`` and write the server parts as a
    Triton repository, ``server/triton`` (see :mod:`edgesplit.workflows.fleet_bundles`)."""


@dataclass(frozen=True)
class FleetResult:
    """What :func:`plan_fleet_file` wrote: the folder and the report (as in its JSON)."""

    out: Path
    report: dict[str, Any]


def _model_path(g: GroupSpec, models_dir: Path) -> str:
    from edgesplit.model import zoo

    if Path(g.model).is_file():
        return g.model
    if g.model in zoo.names():
        path = models_dir / f"{g.model}.onnx"
        if not path.is_file():
            zoo.save(g.model, path)
        return str(path)
    raise FleetError(
        f"{g.source}: groups.{g.name}.model: {g.model!r} is neither a file nor a zoo model"
    )


def check_specs(fleet: FleetSpec) -> None:
    """Every spec the file names loads, before any model is read (one line naming the field)."""
    from edgesplit.device.spec import load_device

    def load(name: str, where: str, kind: str) -> None:
        try:
            spec = load_device(name)
        except InputError as e:
            raise FleetError(f"{where}: {e}") from e
        if spec.kind != kind:
            raise FleetError(f"{where}: '{spec.name}' is a {spec.kind} spec, not a {kind} spec")

    load(fleet.server.spec, f"{fleet.server.source}: server.spec", "server")
    for g in fleet.groups:
        load(g.spec, f"{g.source}: groups.{g.name}.spec", "device")


def _problem(g: GroupSpec, model: str, fleet: FleetSpec, progress: Progress | None):
    from edgesplit.workflows.resolve import Choices, resolve

    name = Path(model).stem
    server_profile = fleet.server.profiles.get(g.model) or fleet.server.profiles.get(name)
    choices = Choices(
        objective=g.objective,
        server=fleet.server.spec,
        server_profile=server_profile,
        link=g.link,
        bandwidth_mbps=g.bandwidth_mbps,
        rtt_ms=g.rtt_ms,
        profile=g.profile,
    )
    try:
        return resolve(model, g.spec, choices, progress=progress)
    except InputError as e:
        raise FleetError(f"{g.source}: groups.{g.name}: {e}") from e


def fleet_candidates(
    fleet: FleetSpec, models_dir: Path, options: FleetOptions, progress: Progress | None = None
) -> dict:
    """Per group name: (problem, cost model, made candidates); alike groups share them. The
    groups' models are written to ``models_dir`` where the file names a zoo model."""
    from edgesplit.fleet.candidates import group_candidates

    cache: dict[tuple, tuple] = {}
    out = {}
    for g in fleet.groups:
        model = _model_path(g, models_dir)
        key = (model, g.spec, g.link, g.bandwidth_mbps, g.rtt_ms, g.profile, g.objective)
        if key not in cache:
            problem = _problem(g, model, fleet, progress)
            made, cm = group_candidates(
                problem,
                max_candidates=options.get("max_candidates", 12),
                max_evals=options.get("max_evals", 150),
            )
            cache[key] = (problem, cm, made)
        out[g.name] = cache[key]
    return out


def _plan_json(problem, cm, assign: np.ndarray, detail: str) -> dict[str, Any]:
    from edgesplit.fleet.candidates import plan_of

    return plan_of(problem, cm, assign, detail).to_json()


def fleet_group(g: GroupSpec, candidates: Sequence[Candidate]) -> Group:
    """The planner's :class:`~edgesplit.fleet.price.Group` for group ``g`` of the fleet file."""
    return Group(g.name, g.count, g.rate_per_s, g.deadline_p95_ms, g.objective, tuple(candidates))


def serve_args(server: Server) -> str:
    """The ``edgesplit serve`` flags of the planned server setting."""
    flags = [
        "--max-batch",
        str(server.max_batch if server.max_queue_delay_ms > 0 else 1),
        "--max-queue-delay-ms",
        f"{server.max_queue_delay_ms:g}",
        "--threads",
        str(server.slots),
    ]
    return shlex.join(flags)


def plan_fleet_file(
    fleet_file: str | os.PathLike,
    out: str | os.PathLike,
    *,
    progress: Progress | None = None,
    **options: Unpack[FleetOptions],
) -> FleetResult:
    """Plan the fleet of ``fleet_file`` together and write ``out/``: ``groups/NAME/plan.json``,
    ``server/serve.args`` (and ``server/replicas``), ``fleet-report.json``; all or nothing. With
    ``bundles``, also ``groups/NAME/bundle`` and the Triton repository ``server/triton``.

    Raises:
        FleetError: a bad fleet file, an unknown spec or model (one line naming file and field).
        PlanError: a group with no plan that runs.
        CompileError, BundleError: with ``bundles``, a plan that does not compile or export.
    """
    from edgesplit.fleet.plan import plan_fleet
    from edgesplit.fleet.price import FleetTable
    from edgesplit.fleet.report import report

    fleet = load_fleet(fleet_file)
    check_specs(fleet)
    out = Path(out)
    refuse_to_replace(
        out,
        force=options.get("force", False),
        ours=lambda p: (p / OUT_MARKER).is_file(),
        what="a fleet plan",
        error=FleetError,
    )
    models_dir = out.parent / f".{out.name}.models"
    made = fleet_candidates(fleet, models_dir, options, progress)
    groups = [fleet_group(g, [m.candidate for m in made[g.name][2]]) for g in fleet.groups]
    s = fleet.server
    server = Server(s.slots, s.max_batch, s.max_queue_delay_ms)
    choice = plan_fleet(
        groups,
        server,
        max_replicas=s.max_replicas,
        exact_limit=options.get("exact_limit", 4096),
    )
    data = report(groups, choice, FleetTable(groups, choice.server))
    data["server"]["serve_args"] = serve_args(choice.server)
    compiled = []
    with atomic_dir(out) as tmp:
        for g, i in zip(fleet.groups, choice.pricing.choice):
            problem, cm, cands = made[g.name]
            compiled.append((g.name, str(problem.graph.path), cands[i].candidate.key))
            detail = f"fleet plan {cands[i].candidate.name} of {len(cands)} candidates"
            d = tmp / "groups" / g.name
            d.mkdir(parents=True)
            (d / "plan.json").write_text(
                dump_json(_plan_json(problem, cm, cands[i].assign, detail))
            )
        (tmp / "server").mkdir()
        (tmp / "server" / "serve.args").write_text(data["server"]["serve_args"] + "\n")
        (tmp / "server" / "replicas").write_text(f"{choice.server.replicas}\n")
        if options.get("bundles", False):
            _bundles(tmp, compiled, {g.name: made[g.name][0] for g in fleet.groups}, data, choice)
        (tmp / OUT_MARKER).write_text(dump_json(data))
    return FleetResult(out, data)


def _bundles(tmp: Path, groups: list, problems: dict, data: dict[str, Any], choice) -> None:
    """Each group's bundle and the shared Triton repository, inside the folder being written."""
    from edgesplit.workflows.fleet_bundles import compile_groups, export_shared

    copies = compile_groups(tmp, groups, problems)
    data["bundles"] = {name: f"groups/{name}/bundle" for name, _, _ in groups}
    data["bundles_copied_from"] = {k: v for k, v in copies.items() if k != v}
    data["triton"] = export_shared(tmp, groups, choice.server)
