"""Load, validate and simplify an ONNX model into a :class:`ModelGraph`.

Validation runs before anything else and reports every problem at once (garbage bytes, an
unknown op, domain or opset, a dangling input, a cycle, dynamic or zero-size dimensions, inputs
that are not numbers or too large to allocate, a model over the size limit with its external
data). Models older than opset 7 are upgraded with onnx's version converter. Then onnxslim
folds shape computations for the fixed input shapes, shape inference gives every tensor a static
shape (or one run of ONNX Runtime does, on the sample inputs for shapes that depend on input
values), ORT confirms it can run the result, and every node gets a unique, stable name.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from edgesplit.errors import ModelLoadError
from edgesplit.model import kept
from edgesplit.model.graph import ModelGraph
from edgesplit.model.read import first_line, read_model
from edgesplit.model.scope import all_inputs
from edgesplit.model.shapes import build_graph, check_sizes, value_infos
from edgesplit.model.validate import quiet_ort, structure_problems, value_problems
from edgesplit.model.values import as_value

DEFAULT_MAX_MODEL_MB = 1024.0
"""Models over this size (external data included) are refused: past it, protobuf and a phone's
memory both struggle."""

DEFAULT_MAX_TENSOR_MB = 4096.0
"""Inputs and intermediate tensors over this size are refused before anything allocates them."""

UPGRADE_BELOW_OPSET = 7
"""Models of an older default-domain opset are upgraded first: ONNX Runtime guarantees opset 7
and up, and onnxslim cannot import older models."""

UPGRADE_TO_OPSET = 13

_ASSERTION = re.compile(r"^\S+:\d+: \w+: Assertion `.*?` failed: ")


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


def parse_input_values(specs: Sequence[str]) -> dict[str, np.ndarray]:
    """Parse ``NAME=FILE.npy`` strings (the CLI's ``--input``) into sample input values."""
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise ModelLoadError("--input", f"'{spec}' is not NAME=FILE.npy")
        try:
            out[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise ModelLoadError(file, f"cannot read a .npy array ({first_line(e)})") from e
    return out


def load_model(
    path: str | os.PathLike,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    input_values: Mapping[str, np.ndarray] | None = None,
    max_model_mb: float = DEFAULT_MAX_MODEL_MB,
    max_tensor_mb: float = DEFAULT_MAX_TENSOR_MB,
) -> ModelGraph:
    """Load an ONNX model with static shapes and per-node costs.

    Args:
        path: The ``.onnx`` file.
        input_shapes: Shapes for inputs with dynamic dimensions, e.g. ``{"x": (1, 3, 224, 224)}``.
        input_values: Sample values for inputs whose values decide shapes (an ``Expand`` whose
            shape is an input); their shapes count as given shapes.
        max_model_mb: Refuse models larger than this, external data included.
        max_tensor_mb: Refuse inputs and intermediate tensors larger than this.

    Raises:
        ModelLoadError: naming the file and listing every problem found.
    """
    path = Path(path)
    where = str(path)
    values = {k: as_value(v) for k, v in (input_values or {}).items()}
    shapes = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    model, sha256 = read_model(path, max_model_mb)
    problems = value_problems(model, values, shapes)
    shapes.update({k: tuple(v.shape) for k, v in values.items() if k not in shapes and hasattr(v, "shape")})
    problems += structure_problems(model, shapes, max_tensor_mb)
    if problems:
        raise ModelLoadError(where, problems)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001 - onnx raises several types; all mean "invalid"
        raise ModelLoadError(where, f"invalid model: {first_line(e)}") from e
    _check_sizes_before_folding(where, model, shapes, max_tensor_mb)
    notes: list[str] = []
    model, not_upgraded = _upgrade(model, notes)
    model = kept.simplified(
        model,
        shapes,
        not_upgraded,
        notes,
        lambda made: _simplify(where, model, shapes, cannot_fold=not_upgraded, notes=made),
    )
    return build_graph(where, sha256, model, values, max_tensor_mb, tuple(notes))


def _check_sizes_before_folding(
    where: str, model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], max_tensor_mb: float
) -> None:
    """Tensor sizes that inference finds before folding: onnxslim would compute a huge constant
    (a ConstantOfShape of constant shape) while folding it."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_with_input_shapes(model, shapes), data_prop=True)
    except Exception:  # noqa: BLE001 - strict inference after folding reports what is wrong
        return
    check_sizes(where, inferred, value_infos(inferred), max_tensor_mb)


def _default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _upgrade(model: onnx.ModelProto, notes: list[str]) -> tuple[onnx.ModelProto, str | None]:
    """Upgrade an old-opset model; returns (model, why the upgrade failed or None)."""
    opset = _default_opset(model)
    if opset is None or opset >= UPGRADE_BELOW_OPSET:
        return model, None
    from onnx import version_converter

    try:
        new = version_converter.convert_version(model, UPGRADE_TO_OPSET)
        onnx.checker.check_model(new)
    except Exception as e:  # noqa: BLE001 - the converter raises bare errors per adapter
        no_schema = sorted({n.op_type for n in model.graph.node if not onnx.defs.has(n.op_type, n.domain)})
        why = f"no onnx schema for {', '.join(no_schema)}" if no_schema else _ASSERTION.sub("", first_line(e))
        return model, f"opset {opset} could not be upgraded to {UPGRADE_TO_OPSET} ({why})"
    weights = {t.name for t in new.graph.initializer}
    keep = [i for i in new.graph.input if i.name not in weights]  # IR < 4 listed weights as inputs
    del new.graph.input[:]
    new.graph.input.extend(keep)
    new.ir_version = max(new.ir_version, onnx.helper.find_min_ir_version_for(list(new.opset_import)))
    notes.append(f"upgraded from opset {opset} to {UPGRADE_TO_OPSET} with onnx.version_converter")
    return new, None


def topological(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes in an order where every node follows what it reads (outer-scope reads included)."""
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    deps = [sorted({producer[t] for t in all_inputs(n) if t in producer}) for n in g.node]
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


def _sort_and_name(g: onnx.GraphProto) -> None:
    nodes = topological(g)
    del g.node[:]
    g.node.extend(nodes)
    name_nodes(g)


def name_nodes(g: onnx.GraphProto) -> None:
    """Give every node a unique, stable name: its own where unique, else ``<OpType>_<index>``."""
    seen: set[str] = set()
    for i, node in enumerate(g.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        node.name = name


def _simplify(
    where: str,
    model: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]],
    *,
    cannot_fold: str | None,
    notes: list[str],
) -> onnx.ModelProto:
    """Fold shape computations with onnxslim; or, where there is nothing to fold, fix the input
    shapes and leave the graph as it is (onnxslim failed or could not take it, or it is too big
    for onnxslim to be worth its time)."""
    _sort_and_name(model.graph)
    slim = None
    if cannot_fold is not None:
        if not _nothing_to_fold(model):
            raise ModelLoadError(where, f"{cannot_fold}, and it has shape computations to fold")
        notes.append(f"{cannot_fold}; loaded without folding (nothing to fold)")
    elif _too_big_for_onnxslim(model.graph) and _nothing_to_fold(model):
        notes.append(f"not simplified: nothing to fold in {len(model.graph.node)} nodes")
    else:
        slim = _slim(where, model, shapes, notes)
    if slim is None:
        slim = _with_input_shapes(model, shapes)
    try:
        slim = onnx.shape_inference.infer_shapes(slim, strict_mode=True, data_prop=True)
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(where, f"shape inference failed ({first_line(e)})") from e
    _sort_and_name(slim.graph)
    return slim


def _slim(
    where: str, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], notes: list[str]
) -> onnx.ModelProto | None:
    """onnxslim's result, or None where it fails on a model with nothing to fold."""
    import onnxslim

    spec = [f"{k}:{','.join(map(str, v))}" for k, v in shapes.items()]
    logging.getLogger("onnxslim").setLevel(logging.ERROR)
    given = onnx.ModelProto()
    given.CopyFrom(model)  # onnxslim changes the model it is given
    try:
        with contextlib.redirect_stdout(io.StringIO()), quiet_ort():
            slim = onnxslim.slim(given, input_shapes=spec or None)
        if slim is None:
            raise RuntimeError("onnxslim returned no model")
    except Exception as e:  # noqa: BLE001 - onnxslim raises bare Exceptions
        if not _nothing_to_fold(model):
            raise ModelLoadError(where, f"cannot fold shape computations ({first_line(e)})") from e
        notes.append(f"onnxslim failed ({first_line(e)}); loaded without folding (nothing to fold)")
        return None
    _keep_value_types(model.graph, slim.graph)
    return slim


def _keep_value_types(before: onnx.GraphProto, after: onnx.GraphProto) -> None:
    """Give the values that were sequences or optionals before onnxslim their types back: it
    writes a graph output that is a sequence as a tensor (onnxslim 0.1.98)."""
    types = {vi.name: vi.type for vi in [*before.input, *before.value_info, *before.output]}
    for vi in [*after.input, *after.value_info, *after.output]:
        was = types.get(vi.name)
        if was is not None and was.WhichOneof("value") != vi.type.WhichOneof("value"):
            vi.type.CopyFrom(was)


# onnxslim spends about 8 ms per node here (10,000 nodes: 80 s, on a shared machine) and is
# quadratic in a tensor's consumers; past these sizes a graph with nothing to fold skips it.
_ONNXSLIM_MAX_NODES = 2000
_ONNXSLIM_MAX_FAN = 1000


def _too_big_for_onnxslim(g: onnx.GraphProto) -> bool:
    if len(g.node) > _ONNXSLIM_MAX_NODES:
        return True
    fan: dict[str, int] = {}
    for n in g.node:
        if len(n.input) > _ONNXSLIM_MAX_FAN:
            return True
        for t in n.input:
            fan[t] = fan.get(t, 0) + 1
    return any(c > _ONNXSLIM_MAX_FAN for c in fan.values())


def _with_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[vi.name]:
                dims.add().dim_value = int(d)
    return out


def _nothing_to_fold(model: onnx.ModelProto) -> bool:
    """True when no node reads shapes (Shape, Size) or computes from constants alone: folding
    would not change the graph. (Shapes inference cannot find come from one ORT run later.)"""
    g = model.graph
    constants = {t.name for t in g.initializer} | {
        o for n in g.node if n.op_type == "Constant" for o in n.output
    }
    for n in g.node:
        ins = [t for t in all_inputs(n) if t]
        if n.op_type in ("Shape", "Size") or (n.op_type != "Constant" and ins and set(ins) <= constants):
            return False
    return True
