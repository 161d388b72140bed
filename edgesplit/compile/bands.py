"""Adaptive bundles: a plan per bandwidth band, compiled together, each shared part stored once.

The band analysis itself (a table and a plan per band) is
:func:`edgesplit.optimize.bands.band_analysis`;
:func:`compile_band_parts` compiles the parts the band plans add to a bundle's. A part with the
same processor, backend, nodes and boundary as one already compiled is the same artifact, so it is
named and stored once and the plans list it by that name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from edgesplit.bundle.format import BandPlan, BundleBands, PartArtifact
from edgesplit.compile.split import PartModel, check_parts, extract_parts
from edgesplit.device.spec import NetworkLink
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.bands import BandAnalysis
from edgesplit.optimize.plan import Part


def part_key(p: Part | PartArtifact, nodes: Sequence[str] = ()) -> tuple:
    """What makes two parts the same artifact."""
    names = (t if isinstance(t, str) else t.name for t in p.inputs)
    outs = (t if isinstance(t, str) else t.name for t in p.outputs)
    return (p.processor, p.backend, tuple(sorted(nodes)), tuple(sorted(names)), tuple(sorted(outs)))


def compile_band_parts(
    graph: ModelGraph,
    tmp: Path,
    analysis: BandAnalysis,
    done: dict[tuple, str],
    compile_part: Callable[[Part, PartModel, float, dict[str, str]], PartArtifact],
) -> tuple[list[PartArtifact], list[BandPlan]]:
    """Compile the parts of ``analysis.plans`` not in ``done`` (part key -> name in the bundle).

    ``compile_part(part, extracted, error, producer)`` compiles one extracted part (named as
    in the bundle).
    Returns the new artifacts and the band plans naming their parts.
    """
    new_parts: list[PartArtifact] = []
    band_plans: list[BandPlan] = []
    for k, plan in enumerate(analysis.plans):
        todo = [p for p in plan.parts if part_key(p, p.nodes) not in done]
        names = {p.name: f"b{k}_{p.name}" for p in todo}
        extracted = extract_parts(graph, [(names[p.name], p.inputs, p.outputs) for p in todo])
        reduced = {names[p.name] for p in todo if p.precision != "fp32"}
        errors = check_parts(graph, extracted, reduced=reduced) if extracted else {}
        for p in todo:
            done[part_key(p, p.nodes)] = names[p.name]
        producer = {t: done[part_key(p, p.nodes)] for p in plan.parts for t in p.outputs}
        for p, pm in zip(todo, extracted):
            new_parts.append(compile_part(p, pm, errors[pm.name], producer))
        band_plans.append(BandPlan(plan, tuple(done[part_key(p, p.nodes)] for p in plan.parts)))
    return new_parts, band_plans


def bundle_bands(
    analysis: BandAnalysis, plans: list[BandPlan], default_parts: Sequence[str]
) -> BundleBands:
    """The manifest's band table."""
    table = analysis.table
    assert table is not None
    link = analysis.plans[0].link
    if not isinstance(link, NetworkLink):  # band plans are priced with a link; this is defensive
        link = NetworkLink("", 1.0, 1.0, 0.0, 0.0, 0.0)
    up, down = link.up_mbps or 1.0, link.down_mbps or 1.0
    return BundleBands(
        objective=table.objective,
        lo_mbps=table.lo_mbps,
        hi_mbps=table.hi_mbps,
        bands=tuple(
            {
                "lo_mbps": b.lo_mbps,
                "hi_mbps": b.hi_mbps,
                "plan": b.plan,
                "value_lo": b.value_lo,
                "value_hi": b.value_hi,
            }
            for b in table.bands
        ),
        plans=tuple(plans),
        default_parts=tuple(default_parts),
        down_ratio=down / up,
        rtt_ms=float(link.rtt_ms or 0.0),
        solver_calls=table.solver_calls,
        time_s=round(table.time_s, 6),
    )
