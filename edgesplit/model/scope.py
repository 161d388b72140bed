"""Subgraphs of control-flow nodes (If, Loop, Scan) and the outer-scope tensors they read.

ONNX lets a subgraph read any tensor of an enclosing graph by name without listing it among the
node's inputs. To the rest of edgesplit a control-flow node is one atomic node, so these reads
are its inputs too: they order the nodes, cross part boundaries, and must reach the part that
runs the node.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held in a node's attributes (If's branches, Loop's and Scan's bodies ...)."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def outer_reads(node: onnx.NodeProto) -> list[str]:
    """Tensors of the enclosing scopes that ``node``'s subgraphs read, in first-read order.

    Names a subgraph defines (its inputs, initializers, node outputs) shadow outer names, so
    they are not outer reads, at any depth of nesting.
    """
    out: dict[str, None] = {}
    stack: list[tuple[onnx.GraphProto, frozenset[str]]] = [
        (g, frozenset()) for g in subgraphs(node)
    ]
    while stack:
        g, bound_above = stack.pop()
        bound = set(bound_above)
        bound.update(i.name for i in g.input)
        bound.update(t.name for t in g.initializer)
        bound.update(t.values.name for t in g.sparse_initializer)
        bound.update(o for n in g.node for o in n.output if o)
        inner = frozenset(bound)
        for n in g.node:
            for t in n.input:
                if t and t not in bound:
                    out[t] = None
            stack.extend((sub, inner) for sub in subgraphs(n))
    return list(out)


_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def all_inputs(node: onnx.NodeProto) -> list[str]:
    """A node's inputs (optional ones left out dropped) followed by its outer-scope reads."""
    seen = dict.fromkeys(t for t in node.input if t)
    if any(a.type in _GRAPH_TYPES for a in node.attribute):
        for t in outer_reads(node):
            seen.setdefault(t)
    return list(seen)


def all_graphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``g`` and every subgraph nested in it, iteratively (no recursion limit on deep nesting)."""
    stack = [g]
    while stack:
        cur = stack.pop()
        yield cur
        for n in cur.node:
            stack.extend(subgraphs(n))


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of the model: initializers and attribute tensors, in all subgraphs."""
    graphs = list(all_graphs(model.graph))
    for f in model.functions:
        for n in f.node:
            yield from _attribute_tensors(n)
            for sub in subgraphs(n):
                graphs.extend(all_graphs(sub))
    for g in graphs:
        yield from g.initializer
        for s in g.sparse_initializer:
            yield s.values
            yield s.indices
        for n in g.node:
            yield from _attribute_tensors(n)


def _attribute_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("sparse_tensor"):
            yield a.sparse_tensor.values
            yield a.sparse_tensor.indices
