"""``deploy``: profile, partition and compile in one step (the Python deployment API)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from edgesplit.compile.bundle import Manifest


def deploy(
    model: str | os.PathLike,
    device: str = "host",
    out: str | os.PathLike = "bundle",
    *,
    objective: str = "latency",
    profile: str | os.PathLike | None = None,
    server: str | None = None,
    link: str | None = None,
    bandwidth_mbps: float | None = None,
    rtt_ms: float | None = None,
    slo_ms: float | None = None,
    pins: Mapping[str, str] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    runs: int = 10,
    tune_trials: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> Manifest:
    """Profile ``model`` on ``device`` (measured here, predicted elsewhere), partition it for
    ``objective`` and compile the plan into a bundle at ``out``.

    The bundle's manifest carries the plan (its ``plan`` field), with the predicted figures and
    the baselines. Returns the manifest; open the bundle with :func:`edgesplit.load`.
    """
    from edgesplit.compile.api import compile_bundle
    from edgesplit.device import load_device, network_link
    from edgesplit.model.load import load_model
    from edgesplit.optimize import partition
    from edgesplit.profile.run import profile_model
    from edgesplit.profile.store import load_profile

    graph = load_model(model, input_shapes)
    spec = load_device(device)
    server_spec = load_device(server) if server else None
    full = spec.with_server(server_spec) if server_spec else spec
    prof = (
        load_profile(profile)
        if profile
        else profile_model(graph, full, runs=runs, warmup=3, progress=progress)
    )
    net = network_link(link, bandwidth_mbps=bandwidth_mbps, rtt_ms=rtt_ms) if server else None
    plan = partition(
        graph,
        spec,
        objective=objective,
        profile=prof,
        server=server_spec,
        link=net,
        slo_ms=slo_ms,
        pins=dict(pins or {}),
    )
    manifest = compile_bundle(graph, plan, out, device=full, tune_trials=tune_trials, progress=progress)
    return manifest
