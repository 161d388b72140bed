"""Static shapes for every tensor, and the :class:`ModelGraph` built from them.

Shape inference gives most shapes. Tensors it leaves open (data-dependent ops, shapes computed
from input values) get theirs from one ONNX Runtime run: on the sample values given for inputs
whose values decide shapes, else a clear error names those inputs. Every tensor is checked
against the size limit before anything allocates it, and must hold numbers, bools or strings.
Sequences of tensors and optional values are values of the graph too: their types come from
inference (a sequence has no static shape; its tensors' may vary).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesplit import limits
from edgesplit.errors import ModelLoadError
from edgesplit.model.flops import control_flow_flops, count_flops
from edgesplit.model.graph import ModelGraph, Node, TensorInfo
from edgesplit.model.scope import all_inputs
from edgesplit.model.validate import MOVABLE_TYPES, human_bytes, ort_message, ort_session, type_name


class ValueType(NamedTuple):
    """What inference (or one run) says of a value: static shape or None, element type, kind."""

    shape: tuple[int, ...] | None
    elem: int
    kind: str = "tensor"


Infos = dict[str, ValueType]

PROBE_TIMEOUT_S = 60.0
"""The one run that finds data-dependent shapes is stopped after this long (ORT's terminate
flag)."""


def _tensor_type(tt: onnx.TypeProto.Tensor) -> ValueType:
    dims = [
        d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim
    ]
    static = tt.HasField("shape") and all(d is not None for d in dims)
    return ValueType(tuple(dims) if static else None, tt.elem_type)  # type: ignore[arg-type]


def value_type(t: onnx.TypeProto) -> ValueType | None:
    """A tensor's, a sequence of tensors' or an optional's :class:`ValueType`; None for other types
    (maps, sequences of sequences). A sequence's shape is ``()``; an optional's is its tensor's."""
    which = t.WhichOneof("value")
    if which == "tensor_type":
        return _tensor_type(t.tensor_type)
    if which == "sequence_type" and t.sequence_type.elem_type.HasField("tensor_type"):
        return ValueType((), t.sequence_type.elem_type.tensor_type.elem_type, "sequence")
    if which == "optional_type":
        inner = value_type(t.optional_type.elem_type)
        if inner is not None and inner.kind != "optional":
            return ValueType(
                () if inner.kind == "sequence" else inner.shape, inner.elem, "optional"
            )
    return None


def value_infos(model: onnx.ModelProto) -> Infos:
    """Value name -> :class:`ValueType`, from the top-level graph."""
    g = model.graph
    out: Infos = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        vt = value_type(vi.type)
        if vt is not None:
            out[vi.name] = vt
    for t in g.initializer:
        out[t.name] = ValueType(tuple(t.dims), t.data_type)
    return out


def _needed(g: onnx.GraphProto) -> set[str]:
    return {t for n in g.node for t in [*all_inputs(n), *n.output] if t} | {
        o.name for o in g.output
    }


def _unknown(infos: Infos, t: str) -> bool:
    vt = infos.get(t)
    return vt is None or vt.shape is None


def missing_shapes(model: onnx.ModelProto) -> list[str]:
    """Tensors the top-level nodes read or write whose shape inference left open."""
    infos = value_infos(model)
    return sorted(t for t in _needed(model.graph) if _unknown(infos, t))


def check_sizes(where: str, model: onnx.ModelProto, infos: Infos, max_tensor_mb: float) -> None:
    """Refuse the first tensor of a known shape over the size limit, naming the node writing it."""
    weights = {t.name for t in model.graph.initializer}
    producer = {o: n.name for n in model.graph.node for o in n.output}
    for name, (shape, elem, kind) in infos.items():
        if shape is None or name in weights or kind == "sequence":
            continue
        itemsize = _itemsize(elem)
        nbytes = math.prod(shape) * itemsize
        if nbytes > max_tensor_mb * 1e6:
            by = f" (written by node '{producer[name]}')" if name in producer else ""
            raise ModelLoadError(
                where,
                f"tensor '{name}'{by} of shape {list(shape)} needs {human_bytes(nbytes)}, over the "
                "tensor "
                f"size limit of {max_tensor_mb:g} MB",
            )


def _itemsize(elem: int) -> int:
    """Bytes per element (a string: a reference, 8); 1 for a type numpy lacks (refused later)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).itemsize if elem else 4
    except Exception:  # noqa: BLE001 - an element type numpy does not have
        return 1


SHAPE_INPUTS = frozenset(
    {("Resize", 1), ("Resize", 2), ("Resize", 3), ("Upsample", 1), ("OneHot", 1)}
)
"""Float inputs whose values decide the output's shape (Resize scales, a OneHot depth; integer and
bool ones are suspected anyway)."""

_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def _value_dependent_inputs(
    model: onnx.ModelProto, missing: list[str], have: Mapping[str, object]
) -> list[str]:
    """Graph inputs (without sample values) upstream of the tensors left open whose values may
    decide shapes: integers, bools, sequences, and floats read as Resize scales."""
    g = model.graph
    weights = {t.name for t in g.initializer}
    inputs = {i.name: i for i in g.input if i.name not in weights}
    producer = {o: n for n in g.node for o in n.output if o}
    seen: set[tuple[str, bool]] = set()
    stack = [(t, False) for t in missing]
    found: dict[str, None] = {}
    while stack:
        t, as_shape = stack.pop()
        if (t, as_shape) in seen:
            continue
        seen.add((t, as_shape))
        if t in inputs:
            tt = inputs[t].type
            elem = tt.tensor_type.elem_type if tt.HasField("tensor_type") else None
            if (elem not in _FLOATS or as_shape) and t not in have:
                found[t] = None
        elif t in producer:
            n = producer[t]
            stack.extend((x, (n.op_type, k) in SHAPE_INPUTS) for k, x in enumerate(all_inputs(n)))
    return sorted(found)


def _shapes_by_running(
    where: str, model: onnx.ModelProto, names: list[str], values: Mapping[str, np.ndarray]
) -> Infos:
    """Shapes that inference could not find, read off one ORT run (sample values where given)."""
    from edgesplit.model.bounds import model_bounds
    from edgesplit.model.feeds import random_tensor

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    sess = ort_session(where, probe)
    weights = {t.name for t in model.graph.initializer}
    infos = value_infos(model)
    made_up = [
        vi.name for vi in model.graph.input if vi.name not in weights and vi.name not in values
    ]
    bounds = model_bounds(model, made_up)
    rng = np.random.default_rng(0)
    feeds: dict[str, object] = {n: values[n] for n in values}
    for name in made_up:
        shape, elem, _ = infos[name]  # the inputs' types are checked before: static tensors
        info = TensorInfo(
            name, shape or (), np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name, 0
        )
        feeds[name] = random_tensor(info, rng, bounds.get(name))
    stop = limits.run_options()  # stopped at the load stage's deadline too
    timer = threading.Timer(PROBE_TIMEOUT_S, lambda: setattr(stop, "terminate", True))
    timer.start()
    try:
        results = sess.run(names, feeds, stop)
    except Exception as e:  # noqa: BLE001 - ORT's run errors, MemoryError included
        shown = ", ".join(names[:5])
        why = (
            f"it ran over {PROBE_TIMEOUT_S:g} s and was stopped (a loop that does not end?)"
            if stop.terminate
            else ort_message(e)
        )
        raise ModelLoadError(
            where, f"no static shape for {len(names)} tensors ({shown}): one run failed ({why})"
        ) from e
    finally:
        timer.cancel()
    return {name: _run_type(value) for name, value in zip(names, results)}


def _elem(arr: np.ndarray) -> int:
    return (
        helper.np_dtype_to_tensor_dtype(arr.dtype)
        if arr.dtype != object
        else onnx.TensorProto.STRING
    )


def _run_type(value: object) -> ValueType:
    """The type of a value ORT returned: an array, a list (a sequence), None (an empty optional)."""
    if isinstance(value, list):
        return ValueType(
            (), _elem(np.asarray(value[0])) if value else onnx.TensorProto.UNDEFINED, "sequence"
        )
    if value is None:
        return ValueType((), onnx.TensorProto.UNDEFINED, "optional")
    arr = np.asarray(value)
    return ValueType(tuple(arr.shape), _elem(arr))


def _complete(
    where: str, model: onnx.ModelProto, values: Mapping[str, np.ndarray], max_tensor_mb: float
) -> Infos:
    infos = value_infos(model)
    check_sizes(where, model, infos, max_tensor_mb)
    missing = sorted(t for t in _needed(model.graph) if _unknown(infos, t))
    if not missing:
        ort_session(where, model)  # the last word: ORT can run what we will split
        return infos
    waiting = _value_dependent_inputs(model, missing, values)
    if waiting:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ModelLoadError(
            where,
            (
                f"the shapes of {len(missing)} tensors ({shown}) depend"
                if len(missing) > 1
                else f"the shape of {shown} depends"
            )
            + " on the values of input "
            + ", ".join(f"'{n}'" for n in waiting)
            + "; give sample values (--input "
            + " --input ".join(f"{n}=FILE.npy" for n in waiting)
            + ")",
        )
    infos.update(_shapes_by_running(where, model, missing, values))
    check_sizes(where, model, infos, max_tensor_mb)
    return infos


def _tensors(where: str, model: onnx.ModelProto, infos: Infos) -> dict[str, TensorInfo]:
    g = model.graph
    weights = {t.name for t in g.initializer}
    producer = {o: n.name for n in g.node for o in n.output}
    tensors: dict[str, TensorInfo] = {}
    bad: list[str] = []
    for name in sorted(_needed(g) | {i.name for i in g.input}):
        shape, elem, kind = infos[name]
        assert shape is not None
        if elem and elem not in MOVABLE_TYPES and name not in weights:
            by = f" (written by node '{producer[name]}')" if name in producer else ""
            bad.append(f"tensor '{name}'{by} has element type {type_name(elem)}")
            continue
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype("float32")
        nbytes = 0 if kind == "sequence" else math.prod(shape) * dtype.itemsize
        tensors[name] = TensorInfo(name, tuple(shape), dtype.name, nbytes, name in weights, kind)
    if bad:
        raise ModelLoadError(where, bad[:5] + ["edgesplit moves numbers, bools and strings only"])
    return tensors


def _flops(
    node: onnx.NodeProto, tensors: dict[str, TensorInfo], consts: Mapping[str, onnx.TensorProto]
) -> int:
    in_shapes = [tensors[t].shape if t else None for t in node.input]
    out_shapes = [tensors[t].shape for t in node.output if t]
    if node.op_type not in ("If", "Loop", "Scan"):
        return count_flops(node, in_shapes, out_shapes)
    trips = 1
    if node.op_type == "Loop" and node.input and node.input[0] in consts:
        trips = int(numpy_helper.to_array(consts[node.input[0]]).reshape(-1)[0])
    elif node.op_type == "Scan":
        n_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 1)
        first = in_shapes[len(in_shapes) - n_scan] if n_scan else None
        trips = first[0] if first else 1
    shapes = {t: i.shape for t, i in tensors.items()}
    return control_flow_flops(node, shapes, max(trips, 1))


def build_graph(
    where: str,
    sha256: str,
    model: onnx.ModelProto,
    values: Mapping[str, np.ndarray],
    max_tensor_mb: float,
    notes: tuple[str, ...],
) -> ModelGraph:
    """The :class:`ModelGraph` of a simplified, shape-inferred model."""
    g = model.graph
    tensors = _tensors(where, model, _complete(where, model, values, max_tensor_mb))
    weights = {t.name for t in g.initializer}
    consts = {t.name: t for t in g.initializer}
    nodes = []
    for n in g.node:
        ins = all_inputs(n)
        outs = [t for t in n.output if t]
        try:
            flops = _flops(n, tensors, consts)
        except Exception as e:  # noqa: BLE001 - a malformed node's shapes; say which
            raise ModelLoadError(
                where, f"node '{n.name}' ({n.op_type}): cannot count FLOPs ({e})"
            ) from e
        nodes.append(
            Node(
                name=n.name,
                op_type=n.op_type,
                domain=n.domain,
                inputs=tuple(ins),
                outputs=tuple(outs),
                flops=flops,
                bytes_read=sum(tensors[t].nbytes for t in ins),
                bytes_written=sum(tensors[t].nbytes for t in outs),
                weight_nbytes=sum(tensors[t].nbytes for t in ins if t in weights),
                outer_inputs=tuple(t for t in ins if t not in n.input),
            )
        )
    inputs = tuple(i.name for i in g.input if i.name not in weights)
    return ModelGraph(
        path=where,
        sha256=sha256,
        model=model,
        nodes=tuple(nodes),
        tensors=tensors,
        inputs=inputs,
        outputs=tuple(o.name for o in g.output),
        notes=notes,
        sample_inputs={k: v for k, v in values.items() if k in inputs},
    )
