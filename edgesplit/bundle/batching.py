"""Batch-free parts: a part's ONNX with its first dimension made free, checked by running it.

A server that batches (``edgesplit serve --max-batch``, Triton's ``dynamic_batching``) stacks the
requests for one part along the first dimension, runs the part once and splits the outputs. That
is right only when the part treats the rows of its first dimension independently. Parts are
compiled with static shapes, so :func:`free_batch` rewrites one:

* every graph input and output gets the symbolic first dimension :data:`BATCH_DIM`;
* the inferred intermediate shapes (``value_info``) are dropped (they hold the static size);
* a ``Reshape`` target shape that is an initializer (read by Reshapes only) starting with the
  per-request batch size gets ``0`` there instead (copy the input's first dimension), the usual
  static flatten and attention-head split.

Then it runs the rewritten part on two different random requests stacked, and the original part
on each of them. The part is batchable when every output has twice the rows and matches the
per-request outputs (within :data:`RTOL` / :data:`ATOL`: a larger batch may take another kernel
path). Anything else (a rank-0 tensor, inputs with different first dimensions, an op that mixes
rows, an error) leaves it unbatchable, with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from edgesplit.bundle.format import TensorSpec

BATCH_DIM = "batch"
RTOL = 1e-4
ATOL = 1e-5


@dataclass(frozen=True)
class Batchable:
    """What :func:`free_batch` found: the batch-free ONNX, or why there is none.

    Attributes:
        onnx_bytes: The part with a free first dimension (None: the part cannot be batched).
        rows: The first dimension of one request's inputs (the part's own batch size).
        reason: Why the part cannot be batched ("" when it can).
    """

    onnx_bytes: bytes | None
    rows: int
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.onnx_bytes is not None


def _static_check(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> str:
    if not inputs:
        return "it has no inputs"
    flat = [t.name for t in (*inputs, *outputs) if len(t.shape) == 0]
    if flat:
        return f"{', '.join(flat[:4])} has no batch dimension (rank 0)"
    rows = {t.shape[0] for t in inputs}
    if len(rows) != 1 or min(rows) < 1:
        return f"its inputs do not share a first dimension ({sorted(rows)})"
    return ""


def _free_dims(model: onnx.ModelProto, rows: int) -> None:
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    for vi in [*(i for i in g.input if i.name not in inits), *g.output]:
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = BATCH_DIM
    del g.value_info[:]
    other_use = {  # initializers read other than as a Reshape's target shape are left alone
        name
        for node in g.node
        for k, name in enumerate(node.input)
        if not (node.op_type == "Reshape" and k == 1)
    }
    targets = {n.input[1] for n in g.node if n.op_type == "Reshape" and len(n.input) > 1}
    for name in sorted(targets - other_use):
        init = inits.get(name)
        if init is None:
            continue
        shape = numpy_helper.to_array(init).copy()
        if shape.ndim == 1 and shape.size and shape[0] == rows:
            shape[0] = 0
            init.CopyFrom(numpy_helper.from_array(shape, init.name))


def _sample(t: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(t.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(t.shape).astype(dtype)
    return np.zeros(t.shape, dtype)  # indices, masks: zero is valid for any of them


def _run_check(
    original: bytes, free: bytes, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> str:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    providers = ["CPUExecutionProvider"]
    rng = np.random.default_rng(0)
    samples = [{t.name: _sample(t, rng) for t in inputs} for _ in range(2)]
    names = [t.name for t in outputs]
    try:
        one = ort.InferenceSession(original, so, providers=providers)
        alone = [one.run(names, s) for s in samples]
        stacked = {t.name: np.concatenate([s[t.name] for s in samples]) for t in inputs}
        both = ort.InferenceSession(free, so, providers=providers).run(names, stacked)
    except Exception as e:  # noqa: BLE001 - any failure means: serve it unbatched
        return f"it does not run with a free first dimension ({str(e).splitlines()[0][:160]})"
    for k, name in enumerate(names):
        a, b = alone[0][k], alone[1][k]
        got = both[k]
        if a.ndim == 0 or got.shape != (a.shape[0] * 2, *a.shape[1:]):
            return (
                f"output {name} does not grow with the batch ({list(a.shape)} -> {list(got.shape)})"
            )
        want = np.concatenate([a, b])
        if not np.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True):
            return (
                f"output {name} mixes the requests of a batch (batched differs from one at a time)"
            )
    return ""


def free_batch(
    onnx_bytes: bytes, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> Batchable:
    """The part ``onnx_bytes`` (tensors ``inputs`` -> ``outputs``) with a free first dimension.

    Returns :class:`Batchable` with the rewritten ONNX when a stacked run matches runs one at a
    time, else with the reason (never raises for a part that cannot batch).
    """
    reason = _static_check(inputs, outputs)
    if reason:
        return Batchable(None, 0, reason)
    rows = inputs[0].shape[0]
    model = onnx.load_from_string(onnx_bytes)
    _free_dims(model, rows)
    free = model.SerializeToString()
    reason = _run_check(onnx_bytes, free, inputs, outputs)
    return Batchable(None if reason else free, rows, reason)
