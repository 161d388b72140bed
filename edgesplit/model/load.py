"""Load, validate and simplify an ONNX model into a :class:`ModelGraph`.

Validation runs before anything else and reports every problem at once (garbage bytes, an
unknown op, domain or opset, a dangling input, a cycle, dynamic or zero-size dimensions, inputs
that are not numbers or too large to allocate, a model over the size limit with its external
data). Models older than opset 7 are upgraded with onnx's version converter, and checked
against the original (:mod:`edgesplit.model.upgrade`). Then onnxslim folds shape computations for
the fixed input shapes, shape inference gives every tensor a static shape (or one run of ONNX
Runtime does, on the sample inputs for shapes that depend on input values), ORT confirms it can
run the result, and every node gets a unique, stable name (:mod:`edgesplit.model.simplify`).

Loading runs under the ``load`` stage's time limit, and simplifying within it under the
``simplify`` stage's (:mod:`edgesplit.limits`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from edgesplit import limits
from edgesplit.errors import ModelLoadError
from edgesplit.model import kept, simplify, upgrade
from edgesplit.model.graph import ModelGraph
from edgesplit.model.read import first_line, read_model
from edgesplit.model.shapes import build_graph, check_sizes, value_infos
from edgesplit.model.validate import ort_session, structure_problems, value_problems
from edgesplit.model.values import as_value

DEFAULT_MAX_MODEL_MB = 1024.0
"""Models over this size (external data included) are refused: past it, protobuf and a phone's
memory both struggle."""

DEFAULT_MAX_TENSOR_MB = 4096.0
"""Inputs and intermediate tensors over this size are refused before anything allocates them."""


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
    """Parse ``NAME=FILE.npy`` strings (the CLI's ``--input``) into sample input values.

    Raises:
        ModelLoadError: naming the flag or the file: not ``NAME=FILE``, a file that is not a
            regular file (a directory, a FIFO, which would block) or not a ``.npy`` array
            (pickles are never loaded).
    """
    import stat

    out: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise ModelLoadError("--input", f"'{spec}' is not NAME=FILE.npy")
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise ModelLoadError(file, f"cannot read the input ({e.strerror})") from e
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            why = "is a directory, not a .npy file" if stat.S_ISDIR(mode) else "not a regular file"
            raise ModelLoadError(file, why)
        with os.fdopen(fd, "rb") as f:
            try:
                out[name] = np.load(f, allow_pickle=False)
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
        StageTimeout: past the ``load`` or ``simplify`` stage's time limit.
    """
    path = Path(path)
    where = str(path)
    with limits.stage_limit("load", where):
        return _load(where, path, input_shapes, input_values, max_model_mb, max_tensor_mb)


def _load(
    where: str,
    path: Path,
    input_shapes: Mapping[str, Sequence[int]] | None,
    input_values: Mapping[str, object] | None,
    max_model_mb: float,
    max_tensor_mb: float,
) -> ModelGraph:
    values = {k: as_value(v) for k, v in (input_values or {}).items()}
    shapes = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    model, sha256 = read_model(path, max_model_mb)
    problems = value_problems(model, values, shapes)
    shapes.update(
        {k: tuple(v.shape) for k, v in values.items() if k not in shapes and hasattr(v, "shape")}
    )
    problems += structure_problems(model, shapes, max_tensor_mb)
    if problems:
        raise ModelLoadError(where, problems)
    notes: list[str] = []
    _check(where, model, notes)
    _check_sizes_before_folding(where, model, shapes, max_tensor_mb)
    limits.check()
    up = upgrade.upgrade(model, shapes, notes)
    model, not_upgraded = up.model, up.failed

    def make(made: list[str]) -> onnx.ModelProto:
        if model is not up.original:
            note = upgrade.check_upgrade(
                where, up.original, model, _check_feeds(model, shapes, values)
            )
            made.extend([note] if note else [])
        return simplify.simplify(where, model, shapes, cannot_fold=not_upgraded, notes=made)

    model = kept.simplified(model, shapes, not_upgraded, notes, make)
    limits.check()
    return build_graph(where, sha256, model, values, max_tensor_mb, tuple(notes))


def _check(where: str, model: onnx.ModelProto, notes: list[str]) -> None:
    """onnx's checker, with shape inference; where only the inference fails and ONNX Runtime
    runs the model anyway (onnx's inference fails on some of its own function expansions), the
    model goes on with a note."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.shape_inference.InferenceError as e:
        try:
            onnx.checker.check_model(model)
            ort_session(where, model)
        except Exception:  # noqa: BLE001 - onnx's and ORT's errors: the inference error says it best
            raise ModelLoadError(where, f"invalid model: {first_line(e)}") from e
        notes.append(f"onnx's shape inference failed ({first_line(e)[:120]}); ONNX Runtime runs it")
    except Exception as e:  # noqa: BLE001 - onnx raises several types; all mean "invalid"
        raise ModelLoadError(where, f"invalid model: {first_line(e)}") from e


def _check_feeds(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], values: Mapping[str, object]
) -> dict[str, object]:
    """Inputs to check an upgrade on: the sample values given, made-up data for the others."""
    from edgesplit.model.bounds import model_bounds
    from edgesplit.model.feeds import random_tensor
    from edgesplit.model.graph import TensorInfo

    shaped = onnx.shape_inference.infer_shapes(simplify.with_input_shapes(model, shapes))
    inferred = value_infos(shaped)
    made = [i.name for i in model.graph.input if i.name not in values]
    bounds = model_bounds(shaped, made)
    rng = np.random.default_rng(0)
    feeds: dict[str, object] = dict(values)
    for name in made:
        shape, elem, _ = inferred[name]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name
        feeds[name] = random_tensor(TensorInfo(name, shape or (), dtype, 0), rng, bounds.get(name))
    return feeds


def _check_sizes_before_folding(
    where: str, model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], max_tensor_mb: float
) -> None:
    """Tensor sizes that inference finds before folding: onnxslim would compute a huge constant
    (a ConstantOfShape of constant shape) while folding it."""
    try:
        inferred = onnx.shape_inference.infer_shapes(
            simplify.with_input_shapes(model, shapes), data_prop=True
        )
    except Exception:  # noqa: BLE001 - strict inference after folding reports what is wrong
        return
    check_sizes(where, inferred, value_infos(inferred), max_tensor_mb)
