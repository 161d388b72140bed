"""``partition``: the public entry point from a model, a device and a profile to a :class:`Plan`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, replace

import numpy as np

from edgesplit.device import DeviceSpec, NetworkLink
from edgesplit.errors import PlanError
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.costs import CostModel, build_costs
from edgesplit.optimize.parts import part_labels
from edgesplit.optimize.plan import Part, Plan, Transfer
from edgesplit.optimize.solve import Outcome, solve
from edgesplit.profile.store import Profile


def complete_profile(graph: ModelGraph, device: DeviceSpec, profile: Profile | None) -> Profile:
    """``profile`` with roofline predictions added for the processors it lacks.

    With no profile at all every entry is predicted; measure the local processors first
    (``edgesplit profile``) for a plan worth running.
    """
    from edgesplit.profile.predict import predict

    if profile is None:
        profile = Profile(graph.sha256, graph.name, device.name, graph.input_shapes(), ())
    entries = list(profile.entries)
    for proc in device.processors:
        measured = any(e.source == "measured" for e in profile.for_processor(proc.name))
        for backend in proc.backends:
            # A backend left out when the processor itself was measured is not a candidate:
            # a roofline guess must not outbid measurements (untuned TVM is 3.5-35x slower than
            # ORT here, DESIGN.md, while the roofline model knows nothing of tuning).
            if profile.entry(proc.name, backend.key) is None and not measured:
                entries.append(predict(graph, proc, backend, device=device.name))
    return replace(profile, entries=tuple(entries))


def partition(
    model_or_graph: ModelGraph | str | os.PathLike,
    device: DeviceSpec | str,
    *,
    objective: str = "latency",
    profile: Profile | str | os.PathLike | None = None,
    server: DeviceSpec | str | None = None,
    link: NetworkLink | str | None = None,
    slo_ms: float | None = None,
    pins: Mapping[str, str] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    time_limit_s: float = 60.0,
    max_evals: int = 300,
) -> Plan:
    """Split a model over a device's processors (and a server's) for an objective.

    Args:
        model_or_graph: A loaded :class:`ModelGraph` or the path of an ONNX file.
        device: A :class:`DeviceSpec` or a spec name / path.
        objective: ``latency``, ``latency_sequential``, ``energy``, ``throughput`` or ``pareto``.
        profile: A :class:`Profile` (or its path); entries it lacks are predicted with the roofline
            model; ``None`` predicts everything.
        server: The server spec (or its name) whose processors may take parts.
        link: The network link (or a preset name from ``devices/links.yaml``); Wi-Fi when a server
            is given without one.
        slo_ms: Latency limit (for ``energy`` and ``pareto``; checked for every objective).
        pins: ``node -> processor`` assignments to force.

    Returns:
        The plan, with the baselines predicted by the same cost model.

    Raises:
        PlanError: a profile for another model, an unknown processor or node in ``pins``, ops no
            processor supports (all listed), an SLO that cannot be met (with the best latency).
    """
    from edgesplit.device import load_device, network_link
    from edgesplit.profile.store import load_profile

    graph = model_or_graph
    if not isinstance(graph, ModelGraph):
        from edgesplit.model.load import load_model

        graph = load_model(graph, input_shapes)
    dev = load_device(device) if isinstance(device, str) else device
    srv = load_device(server) if isinstance(server, str) else server
    if srv is not None and srv.kind != "server":
        raise PlanError(f"'{srv.name}' is a {srv.kind} spec, not a server")
    if srv is not None and link is None:
        link = "wifi"
    net = network_link(link) if isinstance(link, str) else link
    profile_path = None
    if profile is not None and not isinstance(profile, Profile):
        profile_path = str(profile)
        profile = load_profile(profile)
    full = dev.with_server(srv) if srv is not None and not any(p.is_remote for p in dev.processors) else dev
    if profile is not None and profile.model_sha256 != graph.sha256:
        where = f"{profile_path}: " if profile_path else ""
        raise PlanError(
            f"{where}the profile is for model {profile.model_sha256[:12]} ({profile.model_name}), "
            f"not {graph.sha256[:12]} ({graph.name})"
        )
    prof = complete_profile(graph, full, profile)
    cm = build_costs(graph, prof, full, server=srv, link=net if srv is not None else None, pins=pins)
    outcome = solve(cm, objective, slo_ms=slo_ms, time_limit_s=time_limit_s, max_evals=max_evals)
    return make_plan(
        graph,
        cm,
        outcome,
        objective=objective,
        slo_ms=slo_ms,
        device=dev,
        server=srv,
        link=net if srv is not None else None,
        profile_path=profile_path,
    )


def make_plan(
    graph: ModelGraph,
    cm: CostModel,
    out: Outcome,
    *,
    objective: str,
    slo_ms: float | None,
    device: DeviceSpec,
    server: DeviceSpec | None,
    link: NetworkLink | None,
    profile_path: str | None = None,
) -> Plan:
    """Assemble a :class:`Plan` from a solved assignment."""
    x = out.assign
    sched = out.schedule
    backends = [cm.backend[n][x[n]] for n in range(cm.n_nodes)]
    groups = part_labels(cm, x, backends)
    part_of = np.zeros(cm.n_nodes, dtype=np.int64)
    for i, g in enumerate(groups):
        part_of[g] = i
    ins: list[dict[str, None]] = [{} for _ in groups]
    outs: list[dict[str, None]] = [{} for _ in groups]
    succ: list[set[int]] = [set() for _ in groups]
    for f in cm.flows:
        src = part_of[f.src] if f.src >= 0 else -1
        for d in f.dsts:
            if part_of[d] != src:
                ins[part_of[d]][f.tensor] = None
                if src >= 0:
                    outs[src][f.tensor] = None
                    succ[src].add(int(part_of[d]))
        if f.to_home and src >= 0:
            outs[src][f.tensor] = None
    stage = [0] * len(groups)
    for i in range(len(groups)):  # groups are in topological order
        for j in succ[i]:
            stage[j] = max(stage[j], stage[i] + 1)
    parts = []
    for i, g in enumerate(groups):
        p = int(x[g[0]])
        parts.append(
            Part(
                name=f"p{i}",
                processor=cm.processors[p],
                backend=backends[g[0]] or "",
                remote=bool(cm.remote[p]),
                nodes=tuple(cm.nodes[n] for n in g),
                inputs=tuple(ins[i]),
                outputs=tuple(outs[i]),
                latency_ms=round(float(cm.node_ms[g, p].sum()), 6),
                energy_mj=round(float(cm.node_mj[g, p].sum()), 6),
                start_ms=round(float(sched.node_start_ms[g].min()), 6),
                end_ms=round(float(sched.node_end_ms[g].max()), 6),
                stage=stage[i],
            )
        )
    transfers = []
    for c in sched.crossings:
        f = cm.flows[c.flow]
        src_name = parts[part_of[f.src]].name if f.src >= 0 else "input"
        readers = sorted({int(part_of[d]) for d in f.dsts if x[d] == c.dst})
        names = [parts[r].name for r in readers] + (["output"] if f.to_home and c.dst == cm.home else [])
        for k, name in enumerate(names):
            transfers.append(
                Transfer(
                    tensor=f.tensor,
                    nbytes=int(f.nbytes),
                    src_part=src_name,
                    dst_part=name,
                    src_processor=cm.processors[c.src],
                    dst_processor=cm.processors[c.dst],
                    latency_ms=round(c.latency_ms, 6) if k == 0 else 0.0,
                    energy_mj=round(c.energy_mj, 6) if k == 0 else 0.0,
                )
            )
    predicted = {
        "latency_ms": round(sched.makespan_ms, 6),
        "energy_mj": round(sched.energy_mj, 6),
        "throughput_per_s": round(1000.0 / out.period_ms, 6) if out.period_ms > 0 else 0.0,
        "sequential_latency_ms": round(out.sequential_latency_ms, 6),
        "period_ms": round(out.period_ms, 6),
    }
    return Plan(
        model_sha256=graph.sha256,
        model_name=graph.name,
        model_path=os.path.abspath(graph.path),
        device=device.name,
        server=server.name if server is not None else None,
        link=asdict(link) if link is not None else None,
        objective=objective,
        slo_ms=slo_ms,
        assignment={
            cm.nodes[n]: {"processor": cm.processors[x[n]], "backend": backends[n] or ""}
            for n in range(cm.n_nodes)
        },
        parts=tuple(parts),
        transfers=tuple(transfers),
        predicted=predicted,
        baselines=out.baselines,
        solver=replace(out.solver, time_s=round(out.solver.time_s, 6)),
        pareto=out.pareto,
        home=cm.processors[cm.home],
        pins=dict(cm.pins),
        input_shapes={k: tuple(v) for k, v in graph.input_shapes().items()},
        device_path=os.path.abspath(device.path) if device.path else "",
        server_path=os.path.abspath(server.path) if server is not None and server.path else "",
        profile_path=os.path.abspath(profile_path) if profile_path else None,
    )
