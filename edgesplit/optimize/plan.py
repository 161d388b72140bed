"""The Plan: node -> processor, its parts, transfers, predictions, baselines; and its JSON file.

The JSON keeps a stable key order (the field order below) and is written atomically. Times are in
ms, energy in mJ (device side), sizes in bytes. ``parts`` are in a topological order of the part
graph; a transfer's ``src_part`` is ``"input"`` for a graph input (it starts on the home processor)
and its ``dst_part`` is ``"output"`` for a graph output on its way home. A tensor read by several
parts on one processor crosses once: the first such transfer carries the cost, the others 0.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from edgesplit.device.schema import PRECISIONS
from edgesplit.device.spec import NetworkLink
from edgesplit.errors import PlanError
from edgesplit.precision.metrics import check_record
from edgesplit.precision.record import AccuracyRecord
from edgesplit.util import (
    check_fields,
    check_identifier,
    check_number,
    known_fields,
    present_fields,
    read_json_object,
    reading_record,
    short,
    write_json,
)

FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Part:
    """A maximal connected group of nodes on one processor and backend.

    New fields go last with a default, so that older plans still read (see :meth:`Plan.from_json`).

    Attributes:
        latency_ms, energy_mj, start_ms, end_ms: The optimiser's predictions (None in a plan made
            by hand, :func:`edgesplit.compile.manual.contiguous_plan`).
        stage: Depth in the part graph (parts of one stage do not depend on each other).
        precision: What the part runs in (``fp32``, ``fp16``, ``int8``): its backend's precision.
    """

    name: str
    processor: str
    backend: str
    remote: bool = False
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    latency_ms: float | None = None
    energy_mj: float | None = None
    start_ms: float | None = None
    end_ms: float | None = None
    stage: int = 0
    precision: str = "fp32"

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Part:
        kw = known_fields(Part, d)
        for key in ("nodes", "inputs", "outputs"):
            kw[key] = tuple(d[key])
        return Part(**kw)


@dataclass(frozen=True)
class Transfer:
    """One tensor moving between parts on different processors."""

    tensor: str
    nbytes: int
    src_part: str
    dst_part: str
    src_processor: str
    dst_processor: str
    latency_ms: float
    energy_mj: float


@dataclass(frozen=True)
class Baseline:
    """Another system's choice, predicted by the same cost model (``None`` figures: infeasible)."""

    name: str
    latency_ms: float | None
    energy_mj: float | None
    feasible: bool
    assignment_summary: str
    throughput_per_s: float | None = None


@dataclass(frozen=True)
class SolverInfo:
    """Which solver made the plan, how long it took, and how far from optimal it may be.

    Attributes:
        optimal: Proven optimal for ``model`` (``sequential``, ``makespan`` or ``period``).
        gap: Relative gap to the best lower bound known (0 when optimal).
    """

    name: str
    time_s: float
    optimal: bool
    gap: float | None
    model: str = "sequential"
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Predicted:
    """The optimiser's figures for a whole plan (None: not predicted, as in a plan made by hand).

    Attributes:
        latency_ms: One request's makespan.
        energy_mj: One request's energy, device side.
        throughput_per_s: Requests per second of a stream (``1000 / period_ms``; 0 when unknown).
        sequential_latency_ms: One request with its parts run one after another.
        period_ms: A stream's time between requests (of every copy together, with replicas).
        server_devices, server_slots: The server load the plan was priced for: devices sharing the
            server and its slots (None: an unloaded server).
        server_queue_factor: How much that load stretched the server's times.
    """

    latency_ms: float | None = None
    energy_mj: float | None = None
    throughput_per_s: float | None = None
    sequential_latency_ms: float | None = None
    period_ms: float | None = None
    server_devices: int | None = None
    server_slots: int | None = None
    server_queue_factor: float | None = None

    def to_json(self) -> dict[str, float]:
        """The figures that are not None, in field order; the counts as JSON has always had them
        (``2.0``), so that a plan written again is the same file."""
        return {k: float(v) for k, v in present_fields(self).items()}

    @staticmethod
    def from_json(d: Any, where: str) -> Predicted:
        """Read the figures (checked by :func:`check_plan_types`); keys a newer writer added are
        left.

        Raises:
            PlanError: naming ``where``, when the figures are not an object.
        """
        if not isinstance(d, Mapping):
            raise PlanError(f"{where}: expected an object, got {short(d, 40)}")
        kw = known_fields(Predicted, d)
        for key in _COUNTS:
            if isinstance(kw.get(key), float) and kw[key].is_integer():
                kw[key] = int(kw[key])
        return Predicted(**kw)

    def check(self, where: str) -> None:
        """Each figure None or a finite, non-negative number (an integer for the counts).

        Raises:
            PlanError: naming ``where`` and the figure (``plan.json: predicted.latency_ms``).
        """
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                check_number(value, f"{where}.{f.name}", PlanError, integer=f.name in _COUNTS)


_COUNTS = ("server_devices", "server_slots")


def link_from_json(d: Any, where: str) -> NetworkLink | str | None:
    """A plan's network link: a :class:`NetworkLink` as JSON, a preset's name (older plans), or
    None.

    Raises:
        PlanError: naming ``where`` and the key, when a figure is not a finite, non-negative number
            or the link is not one of those.
    """
    if d is None or isinstance(d, str):
        return d
    if not isinstance(d, Mapping):
        raise PlanError(f"{where}: expected an object, a preset's name or null, got {short(d, 40)}")
    _check_link(d, where)  # before it is read: a figure, not a missing key, is named first
    return NetworkLink(**known_fields(NetworkLink, d))


def _check_link(link: Mapping[str, Any], where: str) -> None:
    for key, value in link.items():
        if key not in ("name", "description"):
            check_number(value, f"{where}.{short(key, 40)}", PlanError)
        elif not isinstance(value, str):
            raise PlanError(f"{where}.{key}: expected a string, got {short(value, 40)}")


MANUAL = SolverInfo("manual", 0.0, False, None, "none", "made by hand, not by the optimiser")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A partition of a model over the processors of a device (and a server).

    ``predicted``: the optimiser's figures for the whole plan (:class:`Predicted`).

    ``link``: the network link to the server the plan was priced with; in older plans the name of
    a preset (``wifi``) instead; None without a server.

    ``accuracy`` is the measured accuracy of a plan with reduced-precision parts against fp32
    (:mod:`edgesplit.optimize.accuracy`, :class:`~edgesplit.precision.record.AccuracyRecord`): the
    budget, the figures of the plan and of each such part, the calibration data, and the parts
    dropped to meet the budget; None for an fp32 plan.

    ``cost_sources``: where the figures of each processor/backend pair the plan was priced with
    came from (``measured``, ``predicted`` by the spec's roofline, ``calibrated``...), so that a
    reader sees which parts of a plan rest on measurements; empty in older plans.

    ``splits``: operators split across processors (:class:`edgesplit.model.pieces.Split` as JSON):
    the plan's nodes are those of the model with the splits written in
    (:func:`edgesplit.model.pieces.rewrite`), which ``compile`` does again.

    ``replicas``: for a stream, other processors that each hold a whole copy of the plan's parts
    (a one-part plan: the whole model), so that requests taken from one queue run on whichever copy
    is free; empty for one copy. ``predicted.period_ms`` is then the copies' combined period.

    The fields are in the JSON's key order. A new field goes with a default (in :class:`Part` too):
    :meth:`from_json` fills what an older plan lacks from the defaults, and leaves keys it does not
    know, so adding a field is one line.
    """

    model_sha256: str
    model_name: str
    model_path: str
    device: str
    server: str | None = None
    link: NetworkLink | str | None = None
    objective: str
    slo_ms: float | None = None
    assignment: Mapping[str, Mapping[str, str]]
    parts: tuple[Part, ...]
    transfers: tuple[Transfer, ...] = ()
    predicted: Predicted = field(default_factory=Predicted)
    baselines: tuple[Baseline, ...] = ()
    solver: SolverInfo = MANUAL
    pareto: tuple[Mapping[str, Any], ...] = ()
    home: str = ""
    pins: Mapping[str, str] = field(default_factory=dict)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    device_path: str = ""
    server_path: str = ""
    profile_path: str | None = None
    accuracy: AccuracyRecord | None = None
    server_profile_path: str | None = None
    cost_sources: Mapping[str, str] = field(default_factory=dict)
    replicas: tuple[str, ...] = ()
    splits: tuple[Mapping[str, Any], ...] = ()
    format_version: int = FORMAT_VERSION

    def part_of(self, node: str) -> Part:
        for p in self.parts:
            if node in p.nodes:
                return p
        raise KeyError(node)

    def baseline(self, name: str) -> Baseline | None:
        return next((b for b in self.baselines if b.name == name), None)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        out: dict[str, Any] = {"format_version": d.pop("format_version")}
        out.update(d)
        out["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        out["predicted"] = self.predicted.to_json()
        out["accuracy"] = self.accuracy.to_json() if self.accuracy is not None else None
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as JSON, atomically, with a stable key order."""
        write_json(path, self.to_json(), "plan")

    @staticmethod
    def from_json(d: Mapping[str, Any], source: str = "<plan>") -> Plan:
        with reading_record(
            d, source, "plan", PlanError, format_version=FORMAT_VERSION, say_missing_key=True
        ):
            kw = known_fields(Plan, d)
            kw["parts"] = tuple(Part.from_json(p) for p in d["parts"])
            kw["transfers"] = tuple(
                Transfer(**known_fields(Transfer, t)) for t in d.get("transfers", ())
            )
            kw["baselines"] = tuple(
                Baseline(**known_fields(Baseline, b)) for b in d.get("baselines", ())
            )
            if "solver" in d:
                kw["solver"] = SolverInfo(**known_fields(SolverInfo, d["solver"]))
            kw["pareto"] = tuple(dict(p) for p in d.get("pareto", ()))
            kw["input_shapes"] = {k: tuple(v) for k, v in d.get("input_shapes", {}).items()}
            kw["assignment"] = {k: dict(v) for k, v in d["assignment"].items()}
            kw["link"] = link_from_json(d.get("link"), f"{source}: link")
            kw["predicted"] = Predicted.from_json(d.get("predicted", {}), f"{source}: predicted")
            kw["pins"] = dict(d.get("pins", {}))
            kw["replicas"] = tuple(d.get("replicas", ()))
            kw["splits"] = tuple(dict(s) for s in d.get("splits", ()))
            if d.get("accuracy") is not None:
                where = f"{source}: accuracy"
                kw["accuracy"] = AccuracyRecord.from_json(d["accuracy"], where, PlanError)
            plan = Plan(**kw)
        check_plan_types(plan, source)
        return plan


def check_plan_types(plan: Plan, source: str) -> None:
    """The types of everything in a plan read from JSON, and its numbers finite and not negative
    (from the dataclasses' annotations, :func:`edgesplit.util.check_fields`).

    Raises:
        PlanError: naming ``source``, the field and the value.
    """
    check_fields(plan, source, PlanError)
    for name, shape in plan.input_shapes.items():
        for dim in shape:
            check_number(dim, f"{source}: input_shapes.{short(name, 40)}", PlanError, integer=True)
    plan.predicted.check(f"{source}: predicted")
    if isinstance(plan.link, NetworkLink):
        _check_link(asdict(plan.link), f"{source}: link")
    elif plan.link is not None and not isinstance(plan.link, str):  # a preset's name: older plans
        raise PlanError(f"{source}: link: expected a network link, got {short(plan.link, 40)}")
    if plan.accuracy is not None:
        check_record(plan.accuracy.to_json(), f"{source}: accuracy", PlanError)
    for node, site in plan.assignment.items():
        if not isinstance(site, Mapping) or not all(isinstance(v, str) for v in site.values()):
            raise PlanError(
                f"{source}: assignment.{short(node, 60)}: expected {{processor, backend}} names"
            )
    for i, t in enumerate(plan.transfers):
        check_fields(t, f"{source}: transfers[{i}]", PlanError)
    for i, b in enumerate(plan.baselines):
        check_fields(b, f"{source}: baselines[{i}]", PlanError)
    check_fields(plan.solver, f"{source}: solver", PlanError)
    for i, p in enumerate(plan.parts):
        check_fields(p, f"{source}: parts[{i}]", PlanError)


def check_plan(plan: Plan, source: str) -> None:
    """What later stages rely on in a plan (beyond its types): a positive SLO, and the parts (see
    :func:`check_plan_parts`). :func:`load_plan` and ``compile`` check this.

    Raises:
        PlanError: naming ``source`` and what is wrong.
    """
    if plan.slo_ms is not None and not plan.slo_ms > 0:
        raise PlanError(f"{source}: slo_ms: must be positive, got {plan.slo_ms}")
    check_plan_parts(plan.parts, source)
    if plan.replicas and (len(plan.parts) != 1 or plan.parts[0].remote):
        raise PlanError(
            f"{source}: replicas: only a plan of one local part (the whole model) is copied"
        )
    if len(set(plan.replicas)) != len(plan.replicas) or (
        plan.parts and plan.parts[0].processor in plan.replicas
    ):
        raise PlanError(f"{source}: replicas: each processor holds at most one copy")


def check_plan_parts(parts: Sequence[Part], source: str) -> None:
    """The parts of a plan: at least one; names that are identifiers (they become file names)
    and unique; no node in two parts; no tensor written by two parts; an acyclic part graph.

    Raises:
        PlanError: naming ``source`` and the parts at fault.
    """
    if not parts:
        raise PlanError(f"{source}: the plan has no parts")
    names: set[str] = set()
    owner: dict[str, str] = {}
    producer: dict[str, str] = {}
    for i, p in enumerate(parts):
        check_identifier(p.name, f"{source}: parts[{i}].name", PlanError)
        if p.precision not in PRECISIONS:
            raise PlanError(
                f"{source}: parts[{i}].precision: {short(p.precision, 20)} is not one of "
                f"{', '.join(PRECISIONS)}"
            )
        if p.name in names:
            raise PlanError(f"{source}: two parts are named {p.name}")
        names.add(p.name)
        for n in p.nodes:
            if n in owner:
                raise PlanError(
                    f"{source}: node {short(n, 60)} is in two parts, {owner[n]} and {p.name}"
                )
            owner[n] = p.name
        for t in p.outputs:
            if t in producer:
                raise PlanError(
                    f"{source}: tensor {short(t, 60)} is written by two parts, {producer[t]} and "
                    f"{p.name}"
                )
            producer[t] = p.name
    deps = {p.name: {producer[t] for t in p.inputs if t in producer} for p in parts}
    cycle = find_cycle(deps)
    if cycle:
        raise PlanError(
            f"{source}: the parts depend on each other in a cycle ({' -> '.join(cycle)})"
        )


def find_cycle(deps: Mapping[str, Collection[str]]) -> list[str]:
    """A cycle in the graph ``name -> names it depends on`` (as ``[a, b, a]``), or ``[]``.

    Iterative (no recursion), so a long chain of parts cannot exhaust the stack.
    """
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in deps:
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(deps.get(root, ())))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(deps.get(nxt, ()))))
    return []


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan JSON file.

    Raises:
        PlanError: naming the file, when it is missing, not JSON, or not a plan (see
        :func:`check_plan`).
    """
    plan = Plan.from_json(read_json_object(path, PlanError, "plan"), str(path))
    check_plan(plan, str(path))
    return plan
