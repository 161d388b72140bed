"""Fold a model's shape computations for its input shapes, infer every shape, name every node.

onnxslim folds what depends only on constants and the input shapes. It runs in a child process
(:mod:`edgesplit.model.slim_worker`) under the ``simplify`` stage's time limit
(:mod:`edgesplit.limits`): it folds by running ONNX Runtime, which a model can keep busy for ever.
Where onnxslim fails, or there is nothing to fold and it cannot take the model or would take long
on a large graph, the model keeps its graph and only gets its input shapes (shape inference, and
one run at load for what it leaves open, still give every shape). Strict shape inference follows,
then a topological order with unique node names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from edgesplit import limits
from edgesplit.errors import ModelLoadError
from edgesplit.model import slim_worker
from edgesplit.model.read import first_line
from edgesplit.model.scope import all_inputs
from edgesplit.model.validate import ort_session


def topological(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes in an order where every node follows what it reads (outer-scope reads included)."""
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    deps = [sorted({producer[t] for t in all_inputs(n) if t in producer}) for n in g.node]
    order: list[int] = []
    state = [0] * len(
        g.node
    )  # 0 new, 1 on stack, 2 done; iterative DFS keeps file order where it can
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


def sort_and_name(g: onnx.GraphProto) -> None:
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


def simplify(
    where: str,
    model: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]],
    *,
    cannot_fold: str | None,
    notes: list[str],
) -> onnx.ModelProto:
    """Fold shape computations with onnxslim; or fix the input shapes and leave the graph as it
    is (onnxslim failed, or there is nothing to fold and onnxslim could not take it or is not
    worth its time on a graph this big).

    Raises:
        ModelLoadError: folding or shape inference failed.
        StageTimeout: past the ``simplify`` stage's time limit.
    """
    with limits.stage_limit("simplify", where):
        sort_and_name(model.graph)
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
            slim = with_input_shapes(model, shapes)
        try:
            slim = onnx.shape_inference.infer_shapes(slim, strict_mode=True, data_prop=True)
        except Exception as e:  # noqa: BLE001 - onnx's inference errors
            # it fails on some of onnx's own function expansions (a Div whose input it cannot type)
            # that ONNX Runtime runs: without strict mode it types what it can, and one run at load
            # finds the rest, or ORT's session refuses the model, naming the node
            try:
                slim = onnx.shape_inference.infer_shapes(slim, data_prop=True)
            except Exception:  # noqa: BLE001
                raise ModelLoadError(where, f"shape inference failed ({first_line(e)})") from e
            notes.append(
                f"strict shape inference failed ({first_line(e)[:120]}); shapes it left open are "
                "run"
            )
        sort_and_name(slim.graph)
        return slim


def _slim(
    where: str, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], notes: list[str]
) -> onnx.ModelProto | None:
    """onnxslim's result (in the child process, by the stage's deadline), or None where it fails."""
    declared = {i.name: _static_dims(i) for i in model.graph.input}
    # shapes the model declares already are not given: onnxslim, given input shapes, infers every
    # shape again and drops the value infos it cannot infer (a Loop's carried values)
    spec = [
        f"{k}:{','.join(map(str, v))}" for k, v in shapes.items() if declared.get(k) != tuple(v)
    ]
    try:
        left = limits.remaining_s()  # (None outside a stage: no deadline)
        data, error = slim_worker.slim(
            model.SerializeToString(), spec, 1e9 if left is None else left
        )
    except slim_worker.SlimTimeout:
        raise limits.nearest_error() or ModelLoadError(where, "onnxslim gave no answer") from None
    except slim_worker.SlimCrashed as e:
        error = str(e)
    if error is not None:
        # shape inference (and one run, for what it leaves open) still gives every shape
        notes.append(f"onnxslim failed ({error}); loaded without folding")
        return None
    slim = onnx.load_model_from_string(data)
    _keep_interface(model.graph, slim.graph)
    try:
        ort_session(where, slim)
    except ModelLoadError as e:
        # onnxslim can break a model (an If branch whose output it removed): where ORT runs the
        # model as it was, it loads without folding
        ort_session(where, with_input_shapes(model, shapes))
        notes.append(
            f"onnxslim's result does not run ({e.problems[0][:120]}); loaded without folding"
        )
        return None
    return slim


def _static_dims(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if (
        t is None
        or not t.HasField("shape")
        or not all(d.HasField("dim_value") for d in t.shape.dim)
    ):
        return None
    return tuple(d.dim_value for d in t.shape.dim)


def _keep_interface(before: onnx.GraphProto, after: onnx.GraphProto) -> None:
    """The model's inputs as they were: onnxslim drops inputs that nothing reads (a ``CastLike``'s
    ``like`` in a function's expansion), and writes a graph output that is a sequence as a tensor
    (onnxslim 0.1.98). The values that were sequences or optionals get their types back, and a
    dropped input comes back, read by no node."""
    types = {vi.name: vi.type for vi in [*before.input, *before.value_info, *before.output]}
    for vi in [*after.input, *after.value_info, *after.output]:
        was = types.get(vi.name)
        if was is not None and was.WhichOneof("value") != vi.type.WhichOneof("value"):
            vi.type.CopyFrom(was)
    weights = {t.name for t in before.initializer}
    kept = {i.name for i in after.input}
    inputs = [i for i in before.input if i.name not in weights]
    if any(i.name not in kept for i in inputs):
        now = {i.name: i for i in after.input}
        del after.input[:]
        after.input.extend(now.get(i.name, i) for i in inputs)


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


def with_input_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]
) -> onnx.ModelProto:
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
        if n.op_type in ("Shape", "Size") or (
            n.op_type != "Constant" and ins and set(ins) <= constants
        ):
            return False
    return True
