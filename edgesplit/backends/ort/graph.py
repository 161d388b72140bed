"""Map ORT's optimised graph back to the model's nodes: regions of fused kernels, and layouts.

ORT rewrites the graph before it runs it (fusions such as Conv+Relu, NCHWc layouts with inserted
reorders), so the profiler's kernels are not the model's nodes. The optimised graph (saved by the
profiled session) is grouped into regions joined by tensors that stand for no original tensor, and
each region is mapped back to the original nodes between its inputs and outputs. The same graph
says which tensors ORT holds in its blocked NCHWc layout, where a part boundary costs reorders.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from edgesplit.model.graph import ModelGraph
from edgesplit.model.scope import all_inputs

NCHWC_DOMAIN = "com.microsoft.nchwc"
_SUFFIXES = ("_nchwc",)  # what ORT appends to the name of a node it rewrites for a blocked layout


def _base_name(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def aliases(graph: ModelGraph, optimized: onnx.GraphProto) -> dict[str, str]:
    """Optimised-graph tensors that stand for original ones: the outputs of a rewritten node named
    after an original node (a fused ``Conv+Relu`` keeps the last node's name), by position, or
    after an original tensor (ORT's NCHWc layout names its node ``<output>_nchwc`` and renames the
    output ``reorder_token_*``)."""
    by_name = {n.name: n for n in graph.nodes}
    out = {t: t for t in graph.tensors}
    for node in optimized.node:
        base = _base_name(node.name)
        if base != node.name and base in graph.tensors and node.output and node.output[0]:
            out.setdefault(
                node.output[0], base
            )  # the layout transformer names a node after its output
            continue
        orig = by_name.get(base)
        if orig is None:
            continue
        for t, o in zip(node.output, orig.outputs):
            if t:
                out.setdefault(t, o)
    return out


def _regions(optimized: onnx.GraphProto, alias: Mapping[str, str]) -> list[list[int]]:
    """Group optimised nodes joined by tensors that stand for no original tensor (union-find)."""
    parent = list(range(len(optimized.node)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    producer = {t: i for i, n in enumerate(optimized.node) for t in n.output if t}
    for i, n in enumerate(optimized.node):
        for t in all_inputs(n):
            if t not in alias and t in producer:
                parent[find(i)] = find(producer[t])
    groups: dict[int, list[int]] = {}
    for i in range(len(optimized.node)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _covered(graph: ModelGraph, outputs: set[str], stop: set[str]) -> set[int]:
    """Original nodes that make ``outputs``, walking back until a tensor in ``stop`` (the region's
    inputs, and every tensor another region makes)."""
    seen: set[int] = set()
    stack = [graph.producer[t] for t in outputs if t in graph.producer]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for t in graph.nodes[i].inputs:
            if t not in stop and t in graph.producer:
                stack.append(graph.producer[t])
    return seen


def _mapped(graph: ModelGraph, optimized: onnx.GraphProto) -> list[tuple[list[int], set[int]]]:
    """``[(optimised node indices, original node indices)]``, one pair per region."""
    alias = aliases(graph, optimized)
    regions = _regions(optimized, alias)
    made = [{alias[t] for i in r for t in optimized.node[i].output if t in alias} for r in regions]
    # a control-flow node's subgraphs read outer tensors: they bound its region too
    used = [
        {alias[t] for i in r for t in all_inputs(optimized.node[i]) if t in alias} for r in regions
    ]
    makers: dict[str, int] = {}
    for outs in made:
        for t in outs:
            makers[t] = makers.get(t, 0) + 1
    out = []
    for k, region in enumerate(regions):
        others = {t for t, n in makers.items() if n > (1 if t in made[k] else 0)}
        outs = made[k] - used[k]  # a reorder region reads and writes one tensor: it makes nothing
        covered = _covered(graph, outs, used[k] | others | set(graph.inputs))
        if not covered:  # a layout reorder of a tensor: charged to the node that made it
            covered = {graph.producer[t] for t in made[k] if t in graph.producer}
        out.append((region, covered))
    return out


def map_regions(graph: ModelGraph, optimized: onnx.GraphProto) -> list[tuple[list[str], list[int]]]:
    """``[(optimised node names, original node indices)]``, one pair per region."""
    return [([optimized.node[i].name for i in r], sorted(c)) for r, c in _mapped(graph, optimized)]


def blocked_layout(
    graph: ModelGraph, optimized: onnx.GraphProto
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(blocked tensors, blocked readers)`` of the whole model as ORT optimised it.

    A tensor is *blocked* when ORT keeps it in its NCHWc layout: renamed by the layout transformer,
    or internal to a region that runs NCHWc kernels. A *blocked reader* is a node of such a region
    that reads a blocked tensor from outside its region. Cut at a blocked tensor, ORT reorders it
    out of the blocked layout in the part that makes it, and into it in the part of a blocked
    reader.
    """
    alias = aliases(graph, optimized)
    kept = {t for n in optimized.node for t in n.output}
    blocked = {o for t, o in alias.items() if t != o and o not in kept}
    nchwc = []
    for region, covered in _mapped(graph, optimized):
        ops = [optimized.node[i] for i in region]
        if any(n.domain == NCHWC_DOMAIN and not n.op_type.startswith("Reorder") for n in ops):
            inside = {t for i in covered for t in graph.nodes[i].outputs}
            blocked |= inside - kept
            nchwc.append((covered, inside))
    readers = {
        graph.nodes[i].name
        for covered, inside in nchwc
        for i in covered
        if any(t in blocked and t not in inside for t in graph.nodes[i].inputs)
    }
    return (
        tuple(t for t in graph.tensors if t in blocked),
        tuple(n.name for n in graph.nodes if n.name in readers),
    )
