"""Cut a sub-model out of a :class:`ModelGraph` between given tensors.

Like ``onnx.utils.Extractor``, but it walks the graph through ``Node.inputs``, which include
the outer-scope tensors that control-flow subgraphs read: those become inputs of the part (or
stay inside it), and the initializers that subgraphs read travel with the part. It also takes
shapes from the ModelGraph, so every boundary tensor of a part is static; a sequence or optional
value that crosses a boundary keeps the type inference gave it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from edgesplit.model.graph import ModelGraph


class PartExtractor:
    """Extracts sub-models of one graph; build it once and call :meth:`extract` per part."""

    def __init__(self, graph: ModelGraph):
        self.graph = graph
        g = graph.model.graph
        self._protos = {n.name: n for n in g.node}
        self._weights = {t.name: t for t in g.initializer}
        self._sparse = {t.values.name: t for t in g.sparse_initializer}
        self._types = {vi.name: vi.type for vi in [*g.input, *g.value_info, *g.output]}

    def _value_info(self, name: str, loose: bool = False) -> onnx.ValueInfoProto:
        """``name``'s type: static; ``loose``: its rank only (see :meth:`extract`)."""
        t = self.graph.tensors[name]
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype))
        if t.kind == "tensor":
            return helper.make_tensor_value_info(
                name, elem, [None] * len(t.shape) if loose else list(t.shape)
            )
        vi = onnx.ValueInfoProto(name=name)
        if name in self._types:  # a sequence's or an optional's type as inference gave it
            vi.type.CopyFrom(self._types[name])
        elif t.kind == "sequence":
            vi.type.CopyFrom(
                helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None))
            )
        else:
            vi.type.CopyFrom(
                helper.make_optional_type_proto(helper.make_tensor_type_proto(elem, None))
            )
        return vi

    def nodes_between(self, inputs: Sequence[str], outputs: Sequence[str]) -> list[int]:
        """Indices, in graph order, of the nodes needed for ``outputs`` given ``inputs``.

        Raises:
            ValueError: an output or a tensor some needed node reads is neither given, a weight,
                nor produced inside (a boundary that misses a tensor, outer-scope reads included).
        """
        graph = self.graph
        given = set(inputs)
        seen: set[int] = set()
        stack = list(outputs)
        lacking: dict[str, None] = {}
        visited: set[str] = set()
        while stack:
            t = stack.pop()
            if t in visited or t in given or t in self._weights or t in self._sparse:
                continue
            visited.add(t)
            i = graph.producer.get(t)
            if i is None:
                lacking[t] = None
                continue
            if i not in seen:
                seen.add(i)
                stack.extend(graph.nodes[i].inputs)
        if lacking:
            raise ValueError(
                f"the part needs {', '.join(sorted(lacking))}, which it neither reads nor makes"
            )
        return sorted(seen)

    def extract(
        self, inputs: Sequence[str], outputs: Sequence[str], name: str = "part"
    ) -> onnx.ModelProto:
        """A standalone model that computes ``outputs`` from ``inputs`` (and the weights it reads).

        In a part with control flow (If, Loop, Scan) the inputs and inner tensors are typed by
        rank only: ORT infers the types of every branch of an ``If``, the one not taken too, and
        static shapes it was not written for (an axis of 4 where that branch squeezes one of 1,
        known where the whole model left it open) fail it.
        """
        graph = self.graph
        chosen = self.nodes_between(inputs, outputs)
        read = {t for i in chosen for t in graph.nodes[i].inputs}
        made = {t for i in chosen for t in graph.nodes[i].outputs}
        inner = sorted(made - set(outputs) - set(inputs))
        flow = any(graph.nodes[i].op_type in ("If", "Loop", "Scan") for i in chosen)
        loose = (set(inputs) | set(inner)) if flow else set()
        g = helper.make_graph(
            [self._protos[graph.nodes[i].name] for i in chosen],
            name,
            [self._value_info(t, t in loose) for t in inputs],
            [self._value_info(t) for t in outputs],
            [self._weights[t] for t in sorted(read) if t in self._weights],
            value_info=[self._value_info(t, t in loose) for t in inner if t in graph.tensors],
            sparse_initializer=[self._sparse[t] for t in sorted(read) if t in self._sparse],
        )
        src = graph.model
        m = helper.make_model(
            g, opset_imports=list(src.opset_import), functions=list(src.functions)
        )
        m.ir_version = src.ir_version
        m.producer_name = "edgesplit"
        return m
