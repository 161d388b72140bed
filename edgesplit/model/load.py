"""Load, validate and simplify an ONNX model into a :class:`ModelGraph`.

Validation runs before anything else and reports every problem at once (garbage bytes, an
unknown op or domain, a dangling input, a cycle, dynamic dimensions without a shape, a model over
the size limit). Then onnxslim folds shape computations for the fixed input shapes, shape
inference gives every tensor a static shape, and every node gets a unique, stable name.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgesplit.errors import ModelLoadError
from edgesplit.model.flops import count_flops
from edgesplit.model.graph import ModelGraph, Node, TensorInfo

DEFAULT_MAX_MODEL_MB = 1024.0
"""Models over this size are refused: past it, protobuf and a phone's memory both struggle."""

_KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME=1,3,224,224`` strings (the CLI's ``--input-shape``)."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.split(","))
            if any(d <= 0 for d in shape):
                raise ValueError
        except ValueError:
            raise ModelLoadError(
                "--input-shape", f"'{spec}' is not NAME=D1,D2,... with positive dims"
            ) from None
        out[name] = shape
    return out


def load_model(
    path: str | os.PathLike,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    max_model_mb: float = DEFAULT_MAX_MODEL_MB,
) -> ModelGraph:
    """Load an ONNX model with static shapes and per-node costs.

    Args:
        path: The ``.onnx`` file.
        input_shapes: Shapes for inputs with dynamic dimensions, e.g. ``{"x": (1, 3, 224, 224)}``.
        max_model_mb: Refuse files larger than this.

    Raises:
        ModelLoadError: naming the file and listing every problem found.
    """
    path = Path(path)
    shapes = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    model, sha256 = _read(path, max_model_mb)
    problems = _structure_problems(model, shapes)
    if problems:
        raise ModelLoadError(str(path), problems)
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - onnx raises several types; all mean "invalid"
        raise ModelLoadError(str(path), f"invalid model: {_first_line(e)}") from e
    model = _simplify(path, model, shapes)
    return _build_graph(path, sha256, model)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _read(path: Path, max_model_mb: float) -> tuple[onnx.ModelProto, str]:
    if not path.is_file():
        raise ModelLoadError(str(path), "no such file")
    size = path.stat().st_size
    if size == 0:
        raise ModelLoadError(str(path), "empty file")
    if size > max_model_mb * 1e6:
        raise ModelLoadError(
            str(path), f"{size / 1e6:.1f} MB is over the model size limit of {max_model_mb:g} MB"
        )
    data = path.read_bytes()
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ModelLoadError(str(path), f"not an ONNX model, or truncated ({_first_line(e)})") from e
    if model.ir_version == 0 or not model.HasField("graph") or not model.opset_import:
        raise ModelLoadError(
            str(path), "not an ONNX model, or truncated (no IR version, graph or opset import)"
        )
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(str(path), f"cannot read external weights ({_first_line(e)})") from e
    return model, hashlib.sha256(data).hexdigest()


def _structure_problems(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    g = model.graph
    problems: list[str] = []
    opsets = {o.domain: o.version for o in model.opset_import}
    for domain in opsets:
        if domain not in _KNOWN_DOMAINS:
            problems.append(f"unknown domain '{domain}'")
    unknown: dict[str, None] = {}
    for node in g.node:
        if node.domain not in _KNOWN_DOMAINS:
            if node.domain in opsets:
                continue  # reported once above
            unknown[f"unknown domain '{node.domain}' (op {node.op_type})"] = None
        elif node.domain != "com.microsoft" and not onnx.defs.has(node.op_type, node.domain):
            unknown[
                f"unknown op '{node.op_type}'" + (f" in domain '{node.domain}'" if node.domain else "")
            ] = None
    problems.extend(unknown)

    weights = {t.name for t in g.initializer}
    available = {i.name for i in g.input} | weights | {"", *(o for n in g.node for o in n.output)}
    for i, node in enumerate(g.node):
        for t in node.input:
            if t not in available:
                problems.append(
                    f"node '{node.name or f'#{i}'}' ({node.op_type}) reads '{t}', which nothing produces"
                )
    produced = {o for n in g.node for o in n.output} | {i.name for i in g.input} | weights
    for out in g.output:
        if out.name not in produced:
            problems.append(f"graph output '{out.name}' is never produced")
    cyclic = _cycle_nodes(g)
    if cyclic:
        shown = ", ".join(cyclic[:5]) + (" ..." if len(cyclic) > 5 else "")
        problems.append(f"the graph has a cycle through {len(cyclic)} nodes ({shown})")

    graph_inputs = {i.name: i for i in g.input if i.name not in weights}
    for name in shapes:
        if name not in graph_inputs:
            problems.append(f"--input-shape names '{name}', not an input (inputs: {', '.join(graph_inputs)})")
    for name, vi in graph_inputs.items():
        if not vi.type.HasField("tensor_type"):
            problems.append(f"input '{name}' is not a tensor")
            continue
        dims = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
            for d in vi.type.tensor_type.shape.dim
        ]
        if name in shapes:
            given = shapes[name]
            fixed_mismatch = len(given) == len(dims) and any(
                isinstance(d, int) and d != s for d, s in zip(dims, given)
            )
            if vi.type.tensor_type.HasField("shape") and (len(given) != len(dims) or fixed_mismatch):
                problems.append(
                    f"--input-shape {name}={','.join(map(str, given))} does not fit its shape {dims}"
                )
        elif not vi.type.tensor_type.HasField("shape"):
            problems.append(f"input '{name}' has no shape; pass --input-shape {name}=D1,D2,...")
        elif any(not isinstance(d, int) for d in dims):
            example = ",".join(str(d) if isinstance(d, int) else "N" for d in dims)
            problems.append(
                f"input '{name}' has dynamic dimensions {dims}; pass --input-shape {name}={example}"
            )
    return problems


def _cycle_nodes(g: onnx.GraphProto) -> list[str]:
    """Names of nodes that can never run because they wait on themselves (Kahn's algorithm)."""
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    deps = [{producer[t] for t in n.input if t in producer} for n in g.node]
    users: list[list[int]] = [[] for _ in g.node]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    missing = [len(ds) for ds in deps]
    ready = deque(i for i, m in enumerate(missing) if m == 0)
    done = 0
    while ready:
        i = ready.popleft()
        done += 1
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


def _topological(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    deps = [sorted({producer[t] for t in n.input if t in producer}) for n in g.node]
    order: list[int] = []
    state = [0] * len(g.node)  # 0 new, 1 on stack, 2 done; iterative DFS keeps file order where it can
    for root in range(len(g.node)):
        stack = [(root, 0)]
        while stack:
            i, k = stack.pop()
            if state[i] == 2:
                continue
            state[i] = 1
            if k < len(deps[i]):
                stack.append((i, k + 1))
                d = deps[i][k]
                if state[d] == 0:
                    stack.append((d, 0))
                continue
            state[i] = 2
            order.append(i)
    return [g.node[i] for i in order]


def _simplify(path: Path, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    import onnxslim

    sorted_nodes = _topological(model.graph)
    del model.graph.node[:]
    model.graph.node.extend(sorted_nodes)
    _name_nodes(model.graph)
    spec = [f"{k}:{','.join(map(str, v))}" for k, v in shapes.items()]
    logging.getLogger("onnxslim").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            slim = onnxslim.slim(model, input_shapes=spec or None)
    except Exception as e:  # noqa: BLE001 - onnxslim raises bare Exceptions
        raise ModelLoadError(str(path), f"cannot fold shape computations ({_first_line(e)})") from e
    if slim is None:
        raise ModelLoadError(str(path), "onnxslim returned no model")
    try:
        slim = onnx.shape_inference.infer_shapes(slim, data_prop=True)
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(str(path), f"shape inference failed ({_first_line(e)})") from e
    _name_nodes(slim.graph)
    return slim


def _name_nodes(g: onnx.GraphProto) -> None:
    """Give every node a unique, stable name: its own where unique, else ``<OpType>_<index>``."""
    seen: set[str] = set()
    for i, node in enumerate(g.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        node.name = name


def _value_infos(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...] | None, int]]:
    g = model.graph
    out: dict[str, tuple[tuple[int, ...] | None, int]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim]
        static = tt.HasField("shape") and all(d is not None for d in dims)
        out[vi.name] = (tuple(dims) if static else None, tt.elem_type)  # type: ignore[arg-type]
    for t in g.initializer:
        out[t.name] = (tuple(t.dims), t.data_type)
    return out


def _shapes_by_running(model: onnx.ModelProto, names: list[str]) -> dict[str, tuple[tuple[int, ...], int]]:
    """Shapes that inference could not find (data-dependent ops), read off one ORT run."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    from edgesplit.cpu import ort_session_options

    so = ort_session_options(None, None, graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    weights = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in weights:
            continue
        tt = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [d.dim_value for d in tt.shape.dim]
        feeds[vi.name] = np.random.default_rng(0).random(shape).astype(dtype)
    results = sess.run(names, feeds)
    out = {}
    for name, value in zip(names, results):
        arr = np.asarray(value)
        out[name] = (tuple(arr.shape), helper.np_dtype_to_tensor_dtype(arr.dtype))
    return out


def _build_graph(path: Path, sha256: str, model: onnx.ModelProto) -> ModelGraph:
    g = model.graph
    infos = _value_infos(model)
    needed = {t for n in g.node for t in [*n.input, *n.output] if t}
    missing = sorted(t for t in needed if infos.get(t, (None, 0))[0] is None)
    if missing:
        try:
            infos.update(_shapes_by_running(model, missing))
        except Exception as e:  # noqa: BLE001
            shown = ", ".join(missing[:5])
            raise ModelLoadError(
                str(path), f"no static shape for {len(missing)} tensors ({shown}) ({_first_line(e)})"
            ) from e
    weights = {t.name for t in g.initializer}
    tensors: dict[str, TensorInfo] = {}
    for name in sorted(needed | {i.name for i in g.input} | {o.name for o in g.output}):
        shape, elem = infos[name]
        assert shape is not None
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype("float32")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        tensors[name] = TensorInfo(name, tuple(shape), dtype.name, nbytes, name in weights)

    nodes = []
    for n in g.node:
        ins = [t for t in n.input if t]
        outs = [t for t in n.output if t]
        in_shapes = [tensors[t].shape if t else None for t in n.input]
        out_shapes = [tensors[t].shape for t in outs]
        try:
            flops = count_flops(n, in_shapes, out_shapes)
        except Exception as e:  # noqa: BLE001 - a malformed node's shapes; say which
            raise ModelLoadError(str(path), f"node '{n.name}' ({n.op_type}): cannot count FLOPs ({e})") from e
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
                weight_nbytes=sum(tensors[t].nbytes for t in dict.fromkeys(ins) if t in weights),
            )
        )
    return ModelGraph(
        path=str(path),
        sha256=sha256,
        model=model,
        nodes=tuple(nodes),
        tensors=tensors,
        inputs=tuple(i.name for i in g.input if i.name not in weights),
        outputs=tuple(o.name for o in g.output),
    )
