"""The ModelGraph: an exact, static picture of an ONNX model for the later stages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import onnx


@dataclass(frozen=True)
class TensorInfo:
    """A value of the graph: a tensor with a static shape, or a sequence or optional value.

    Attributes:
        name: The ONNX value name.
        shape: Static shape (every dimension known); for a sequence ``()``, for an optional the
            shape of the tensor it may hold (``()`` when it holds a sequence).
        dtype: numpy dtype name, e.g. ``"float32"``; ``"object"`` for strings; for a sequence or an
            optional, the dtype of its tensors.
        nbytes: Size in bytes (a string counts as a reference, 8 bytes; a sequence as 0: its length
            is not static, and it only moves between parts in one process, by reference).
        is_weight: True for initializers (they live with the part that reads them).
        kind: ``"tensor"``, ``"sequence"`` (of tensors) or ``"optional"``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    is_weight: bool = False
    kind: str = "tensor"


@dataclass(frozen=True)
class Node:
    """One operator with its static costs.

    Attributes:
        name: Unique, stable name (generated as ``<OpType>_<index>`` where the model has none).
        op_type: ONNX op type.
        domain: ONNX domain ('' for the default domain).
        inputs: Names of the tensors read, weights included; optional inputs left out are dropped.
            A control-flow node (If, Loop, Scan) also lists the outer-scope tensors its subgraphs
            read, after its own inputs: to every later stage it is one atomic node.
        outputs: Names of the tensors written.
        flops: Floating-point (or integer) operations, multiply-add counted as 2.
        bytes_read: Bytes of all inputs, weights included.
        bytes_written: Bytes of all outputs.
        weight_nbytes: Bytes of the initializers this node reads.
        outer_inputs: The outer-scope tensors among ``inputs`` (read by subgraphs only).
    """

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int
    bytes_read: int
    bytes_written: int
    weight_nbytes: int
    outer_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelGraph:
    """A loaded, shape-folded model.

    Invariants: ``nodes`` are in topological order with unique names; every tensor a node
    reads or writes is in ``tensors`` with a static shape; ``model`` is the simplified ONNX
    model whose node names equal ``nodes[i].name`` (later stages split and compile it).

    ``notes`` say what loading changed (an opset upgrade, folding skipped); ``sample_inputs``
    are input values the shapes were found with (inputs whose values decide shapes), to be used
    wherever the model is run on made-up data.
    """

    path: str
    sha256: str
    model: onnx.ModelProto = field(repr=False, compare=False)
    nodes: tuple[Node, ...]
    tensors: dict[str, TensorInfo] = field(repr=False)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    notes: tuple[str, ...] = ()
    sample_inputs: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        """A short name: the file name without its extension."""
        base = self.path.replace("\\", "/").rsplit("/", 1)[-1]
        return base[:-5] if base.endswith(".onnx") else base

    @cached_property
    def index(self) -> dict[str, int]:
        """Node name -> position in ``nodes``."""
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def producer(self) -> dict[str, int]:
        """Tensor name -> index of the node that writes it (graph inputs and weights absent)."""
        return {t: i for i, n in enumerate(self.nodes) for t in n.outputs}

    @cached_property
    def consumers(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> indices of the nodes that read it, in order."""
        out: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for t in dict.fromkeys(n.inputs):
                out.setdefault(t, []).append(i)
        return {t: tuple(v) for t, v in out.items()}

    @cached_property
    def edges(self) -> tuple[tuple[int, int, str], ...]:
        """Data edges ``(src, dst, tensor)`` between nodes, one per consumer of a tensor."""
        return tuple(
            (self.producer[t], d, t)
            for t, ds in self.consumers.items()
            if t in self.producer
            for d in ds
        )

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def weight_nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values() if t.is_weight)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Graph input name -> static shape."""
        return {name: self.tensors[name].shape for name in self.inputs}

    def is_chain(self) -> bool:
        """True when every node feeds only the next one (Neurosurgeon's setting)."""
        return all(d == s + 1 for s, d, _ in self.edges)


def part_boundaries(
    graph: ModelGraph, groups: Sequence[Sequence[int]]
) -> list[tuple[list[str], list[str]]]:
    """For groups of node indices: (tensors read from outside, tensors used outside) of each. Nodes
    in no group count as outside every group."""
    owner = {i: k for k, g in enumerate(groups) for i in g}
    out = []
    for k, g in enumerate(groups):
        ins: dict[str, None] = {}
        outs: dict[str, None] = {}
        for i in g:
            node = graph.nodes[i]
            for t in node.inputs:
                if graph.tensors[t].is_weight:
                    continue
                src = graph.producer.get(t)
                if src is None or owner.get(src) != k:
                    ins[t] = None
            for t in node.outputs:
                users = graph.consumers.get(t, ())
                if t in graph.outputs or any(owner.get(u) != k for u in users):
                    outs[t] = None
        out.append((list(ins), list(outs)))
    return out
