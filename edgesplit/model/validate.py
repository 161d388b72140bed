"""Checks on a parsed model before anything runs it, each problem a short phrase.

:func:`structure_problems` looks at the graph alone and reports every problem at once: opsets
and domains, unknown ops, tensors nothing produces (outer-scope reads of subgraphs included),
cycles, and inputs and outputs edgesplit cannot feed or size (dynamic, zero-size, non-numeric, or
too large to allocate). :func:`ort_session` builds an ONNX Runtime session as the last word on
whether the model runs, and turns ORT's multi-line errors into one line naming the node.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgesplit.errors import ModelLoadError
from edgesplit.model.scope import all_graphs, all_inputs

KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")

FEEDABLE_TYPES = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.FLOAT16,
        TensorProto.DOUBLE,
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
        TensorProto.BOOL,
    }
)
"""Element types edgesplit can generate, move between parts and send to a server."""

MOVABLE_TYPES = FEEDABLE_TYPES | {TensorProto.STRING}
"""Element types parts may take and return: strings too (they stay on the CPU, in ORT)."""


def human_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def type_name(elem: int) -> str:
    try:
        return TensorProto.DataType.Name(elem)
    except ValueError:
        return f"type {elem}"


def opset_problems(model: onnx.ModelProto) -> list[str]:
    """Unknown domains that nodes use, and opset versions this ONNX does not define (0, or newer
    than released). A domain imported and not used (a function's expansion that keeps its import)
    is no problem."""
    known = onnx.defs.C.schema_version_map()
    used = {n.domain for g in all_graphs(model.graph) for n in g.node}
    used |= {n.domain for f in model.functions for n in f.node}
    out = []
    for o in model.opset_import:
        if o.domain not in KNOWN_DOMAINS:
            if o.domain in used:
                out.append(f"unknown domain '{o.domain}'")
            continue
        lo, hi = known.get("" if o.domain == "ai.onnx" else o.domain, (1, None))
        if o.version < lo or (hi is not None and o.version > hi):
            label = o.domain or "ai.onnx"
            out.append(
                f"opset {o.version} of domain '{label}' is not a released opset ({lo} to {hi})"
            )
    return out


def _op_problems(model: onnx.ModelProto) -> list[str]:
    opsets = {o.domain for o in model.opset_import}
    functions = {(f.domain, f.name) for f in model.functions}
    unknown: dict[str, None] = {}
    for g in all_graphs(model.graph):
        for node in g.node:
            if (node.domain, node.op_type) in functions:
                continue
            if node.domain not in KNOWN_DOMAINS:
                if node.domain not in opsets:  # a listed domain is reported once by opset_problems
                    unknown[f"unknown domain '{node.domain}' (op {node.op_type})"] = None
            elif not onnx.defs.has(node.op_type, node.domain) and not _ort_has(
                node.domain, node.op_type
            ):
                where = f" in domain '{node.domain}'" if node.domain else ""
                unknown[f"unknown op '{node.op_type}'{where}"] = None
    return list(unknown)


@functools.cache
def _ort_kernels() -> frozenset[tuple[str, str]]:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    return frozenset((k.domain, k.op_name) for k in ort_c.get_all_opkernel_def())


def _ort_has(domain: str, op: str) -> bool:
    """ORT has a CPU kernel for the op: contrib ops, and experimental ones onnx dropped
    (ImageScaler)."""
    return ("" if domain == "ai.onnx" else domain, op) in _ort_kernels()


def structure_problems(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], max_tensor_mb: float
) -> list[str]:
    """Every problem of the graph's structure and interface, without running anything."""
    g = model.graph
    problems = opset_problems(model) + _op_problems(model)
    if not g.node:
        problems.append(
            "the graph has no nodes (its outputs are inputs or weights): nothing to split or run"
        )
    weights = {t.name for t in g.initializer}
    produced = {i.name for i in g.input} | weights | {o for n in g.node for o in n.output if o}
    for i, node in enumerate(g.node):
        for t in all_inputs(node):
            if t not in produced:
                problems.append(
                    f"node '{node.name or f'#{i}'}' ({node.op_type}) reads '{t}', which nothing "
                    "produces"
                )
                if len(problems) > 20:
                    return [*problems, "..."]
    made = {o for n in g.node for o in n.output if o}
    for out in g.output:
        if out.name not in produced:
            problems.append(f"graph output '{out.name}' is never produced")
        elif out.name not in made and g.node:
            # a part produces every output the runtime returns: an input or weight passed
            # straight through has no part to come from
            what = "a weight" if out.name in weights else "an input"
            problems.append(
                f"graph output '{out.name}' is {what} passed through, not computed by a node"
            )
    cyclic = cycle_nodes(g)
    if cyclic:
        shown = ", ".join(cyclic[:5]) + (" ..." if len(cyclic) > 5 else "")
        problems.append(f"the graph has a cycle through {len(cyclic)} nodes ({shown})")
    graph_inputs = {i.name: i for i in g.input if i.name not in weights}
    for name in shapes:
        if name not in graph_inputs:
            problems.append(
                f"--input-shape names '{name}', not an input (inputs: {', '.join(graph_inputs)})"
            )
    for name, vi in graph_inputs.items():
        problems.extend(_input_problems(name, vi, shapes.get(name), max_tensor_mb))
    for vi in g.output:
        elem = _elem_type(vi.type)
        if elem is None:
            problems.append(
                f"output '{vi.name}' is not a tensor, a sequence of tensors or an optional"
            )
        elif elem not in MOVABLE_TYPES | {TensorProto.UNDEFINED}:
            problems.append(
                f"output '{vi.name}' has element type {type_name(elem)}; edgesplit moves numbers, "
                "bools "
                "and strings only"
            )
    return problems


def _elem_type(t: onnx.TypeProto) -> int | None:
    """The element type of a tensor, a sequence of tensors, or an optional of either; None for
    any other type (maps, sequences of sequences)."""
    which = t.WhichOneof("value")
    if which == "tensor_type":
        return t.tensor_type.elem_type
    if which == "sequence_type" and t.sequence_type.elem_type.HasField("tensor_type"):
        return t.sequence_type.elem_type.tensor_type.elem_type
    if (
        which == "optional_type"
        and t.optional_type.elem_type.WhichOneof("value") != "optional_type"
    ):
        return _elem_type(t.optional_type.elem_type)
    return None


def _input_problems(
    name: str, vi: onnx.ValueInfoProto, given: Sequence[int] | None, max_tensor_mb: float
) -> list[str]:
    elem = _elem_type(vi.type)
    if elem is None:
        return [f"input '{name}' is not a tensor, a sequence of tensors or an optional"]
    if elem not in MOVABLE_TYPES:
        return [
            f"input '{name}' has element type {type_name(elem)}; edgesplit feeds numbers, bools "
            "and "
            "strings only"
        ]
    if not vi.type.HasField("tensor_type"):  # a sequence or an optional: its value gives its size
        return (
            [f"--input-shape {name}: a sequence or optional input, whose value gives its size"]
            if given
            else []
        )
    tt = vi.type.tensor_type
    # exporters write -1 for a dynamic dimension (PP-OCR's cls model does)
    dims: list[int | str] = [
        d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
        for d in tt.shape.dim
    ]
    if given is not None:
        fixed_mismatch = len(given) == len(dims) and any(
            isinstance(d, int) and d != s for d, s in zip(dims, given)
        )
        if tt.HasField("shape") and (len(given) != len(dims) or fixed_mismatch):
            return [
                f"--input-shape {name}={','.join(map(str, given))} does not fit its shape {dims}"
            ]
        shape = list(given)
    elif not tt.HasField("shape"):
        return [f"input '{name}' has no shape; pass --input-shape {name}=D1,D2,..."]
    elif 0 in dims:
        return [
            f"input '{name}' has a zero-size dimension {dims}: it holds no data, so there is "
            "nothing to run"
        ]
    elif any(not isinstance(d, int) for d in dims):
        example = ",".join(str(d) if isinstance(d, int) else "N" for d in dims)
        return [
            f"input '{name}' has dynamic dimensions {dims}; pass --input-shape {name}={example}"
        ]
    else:
        shape = [int(d) for d in dims]
    nbytes = math.prod(shape) * helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize
    if nbytes > max_tensor_mb * 1e6:
        return [
            f"input '{name}' of shape {shape} needs {human_bytes(nbytes)}, over the tensor size "
            "limit "
            f"of {max_tensor_mb:g} MB"
        ]
    return []


def cycle_nodes(g: onnx.GraphProto) -> list[str]:
    """Names of nodes that can never run because they wait on themselves (Kahn's algorithm)."""
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    deps = [{producer[t] for t in all_inputs(n) if t in producer} for n in g.node]
    users: list[list[int]] = [[] for _ in g.node]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    missing = [len(ds) for ds in deps]
    ready = deque(i for i, m in enumerate(missing) if m == 0)
    while ready:
        i = ready.popleft()
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                ready.append(u)
    stuck = {i for i, m in enumerate(missing) if m > 0}
    # Drop the nodes that only wait on the cycle (no stuck user) to name the cycle itself.
    changed = True
    while changed:
        changed = False
        for i in list(stuck):
            if not any(u in stuck for u in users[i]):
                stuck.discard(i)
                changed = True
    return [g.node[i].name or f"#{i}" for i in sorted(stuck)]


def _value_problem(name: str, value: object, t: onnx.TypeProto) -> str | None:
    """Why ``value`` cannot be a value of ONNX type ``t`` (None when it can)."""
    which = t.WhichOneof("value")
    if which == "optional_type":
        return None if value is None else _value_problem(name, value, t.optional_type.elem_type)
    if which == "sequence_type":
        if not isinstance(value, list):
            return f"--input {name}: the model takes a sequence, not {type(value).__name__}"
        wrong = (_value_problem(name, v, t.sequence_type.elem_type) for v in value)
        return next((w for w in wrong if w), None)
    if not isinstance(value, np.ndarray):
        return f"--input {name}: the model takes a tensor, not {type(value).__name__}"
    want = np.dtype(helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type))
    return (
        None if value.dtype == want else f"--input {name} is {value.dtype}, the model takes {want}"
    )


def value_problems(
    model: onnx.ModelProto, values: Mapping[str, object], shapes: Mapping[str, Sequence[int]]
) -> list[str]:
    """Sample input values (``--input``) that name no input or do not fit its type or shape."""
    weights = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in weights}
    out = []
    for name, value in values.items():
        vi = inputs.get(name)
        if vi is None:
            out.append(f"--input names '{name}', not an input (inputs: {', '.join(inputs)})")
            continue
        if _elem_type(vi.type) is None:
            continue  # a type edgesplit does not take: structure_problems names it
        problem = _value_problem(name, value, vi.type)
        if problem:
            out.append(problem)
        shape = getattr(value, "shape", None)
        if name in shapes and shape is not None and tuple(shapes[name]) != shape:
            out.append(
                f"--input {name} has shape {list(shape)}, --input-shape says {list(shapes[name])}"
            )
    return out


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_ORT_SOURCE = re.compile(r"/onnxruntime_src/\S+:\d+ .*?\)\s(?=[A-Z])")


def ort_message(e: BaseException) -> str:
    """ORT's error text without its code prefix, source location and C++ signature, on one line."""
    text = " ".join(str(e).split())
    text = _ORT_SOURCE.sub("", _ORT_PREFIX.sub("", text))
    return text[:300] or type(e).__name__


@contextlib.contextmanager
def quiet_ort() -> Iterator[None]:
    """ORT's default logger silenced, then set back to ORT's default (warnings). Sessions made
    here (and onnxslim's, which fold constants with ORT) would otherwise print warnings about old
    opsets, or errors for a constant they cannot fold, beside our one-line message."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    try:
        yield
    finally:
        ort.set_default_logger_severity(2)


def ort_session(path: str, model: onnx.ModelProto | bytes):
    """A CPU ORT session of the model with optimisations off (nodes keep their names).

    Raises:
        ModelLoadError: ORT cannot build the session (opset, kernel, type or shape errors).
    """
    import onnxruntime as ort

    from edgesplit.device.cpu import ort_session_options

    so = ort_session_options(
        None,
        None,
        graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        log_severity_level=4,  # our one-line error replaces ORT's own log lines
    )
    data = model if isinstance(model, bytes) else model.SerializeToString()
    try:
        with quiet_ort():
            return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types per status code
        raise ModelLoadError(path, f"ONNX Runtime cannot run it: {ort_message(e)}") from e
