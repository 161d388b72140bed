"""Hand-made plans: cut a model into contiguous pieces of its topological order.

The optimiser makes real plans; these are for checks and benchmarks that need a given number of
parts on given processors (a contiguous cut of a topological order always has an acyclic part
graph). Parts are balanced by FLOPs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from edgesplit.model.graph import ModelGraph, part_boundaries  # noqa: F401 - re-exported
from edgesplit.optimize.plan import MANUAL, Part, Plan


def contiguous_plan(
    graph: ModelGraph,
    device: str,
    sites: Sequence[tuple[str, str]],
    *,
    weights: Sequence[float] | None = None,
) -> Plan:
    """A plan with ``len(sites)`` parts: contiguous topological slices balanced by FLOPs.

    The plan carries no predictions (its parts' figures are None) and names ``device`` as given,
    a spec name or a spec file; ``device_path`` is set when it is a file.

    Args:
        sites: ``(processor, backend)`` of each part, in order.
        weights: Relative share of the FLOPs for each part (default equal).
    """
    n = len(sites)
    if n > len(graph.nodes):
        raise ValueError(f"{n} parts for {len(graph.nodes)} nodes")
    flops = np.array([max(nd.flops, 1) for nd in graph.nodes], dtype=float)
    cum = np.cumsum(flops) / flops.sum()
    w = np.asarray(weights if weights is not None else [1.0] * n, dtype=float)
    targets = np.cumsum(w / w.sum())[:-1]
    cuts = [0]
    for t in targets:
        c = int(np.searchsorted(cum, t)) + 1
        c = min(max(c, cuts[-1] + 1), len(graph.nodes) - (n - len(cuts)))
        cuts.append(c)
    cuts.append(len(graph.nodes))
    groups = [list(range(a, b)) for a, b in zip(cuts, cuts[1:])]
    parts = tuple(
        Part(
            name=f"p{k}",
            processor=proc,
            backend=backend,
            remote="." in proc,
            nodes=tuple(graph.nodes[i].name for i in g),
            inputs=tuple(ins),
            outputs=tuple(outs),
            stage=k,
        )
        for k, ((ins, outs), g, (proc, backend)) in enumerate(
            zip(part_boundaries(graph, groups), groups, sites)
        )
    )
    return Plan(
        model_sha256=graph.sha256,
        model_name=graph.name,
        model_path=graph.path,
        device=device,
        objective="manual",
        input_shapes=graph.input_shapes(),
        assignment={
            graph.nodes[i].name: {"processor": sites[k][0], "backend": sites[k][1]}
            for k, g in enumerate(groups)
            for i in g
        },
        parts=parts,
        solver=MANUAL,
        device_path=os.path.abspath(device) if os.path.isfile(device) else "",
    )
