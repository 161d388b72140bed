"""Values that cross part boundaries: tensors (numbers, bools, strings), sequences of tensors and
optional values, as ONNX Runtime's Python API takes and returns them: a numpy array (strings as
an object array), a list of arrays, or None (an empty optional).

:func:`as_value` puts a user's value in that form, :func:`check_value` checks it against what a
bundle or a graph says of it (``TensorSpec`` or ``TensorInfo``: name, shape, dtype, kind), and
:func:`rel_error` compares two of them.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgesplit.errors import RunInputError


class ValueSpec(Protocol):
    """What a value should be (``TensorSpec`` of a bundle, ``TensorInfo`` of a graph)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str
    """A ``TensorSpec`` may also have ``dynamic_axes``: axes of any length."""


def as_value(value: object) -> object:
    """``value`` as the runtime passes it: an array (strings as objects), a list of arrays (a
    sequence), or None (an empty optional)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [as_value(v) for v in value]
    arr = np.asarray(value)
    return arr.astype(object) if arr.dtype.kind in "US" else arr


def check_value(spec: ValueSpec, value: object) -> object:
    """``value`` (see :func:`as_value`) checked against ``spec``.

    Raises:
        RunInputError: naming the input: another shape or dtype, a sequence given for a tensor ...
    """
    value = as_value(value)
    where = f"input '{spec.name}'"
    if spec.kind == "optional" and value is None:
        return None
    if spec.kind == "sequence" or (spec.kind == "optional" and isinstance(value, list)):
        if not isinstance(value, list):
            raise RunInputError(
                f"{where}: a sequence (a list of arrays) expected, got {type(value).__name__}"
            )
        for v in value:
            _check_dtype(where, v, spec.dtype)
        return value
    if not isinstance(value, np.ndarray):
        raise RunInputError(f"{where}: an array expected, got {type(value).__name__}")
    axes = getattr(spec, "dynamic_axes", ())
    if not shape_fits(value.shape, spec.shape, axes):
        want = tuple("?" if k in axes else d for k, d in enumerate(spec.shape))
        raise RunInputError(f"{where}: shape {tuple(value.shape)}, expected {want}")
    _check_dtype(where, value, spec.dtype)
    return value


def shape_fits(
    shape: tuple[int, ...], spec: tuple[int, ...], dynamic_axes: tuple[int, ...] = ()
) -> bool:
    """Whether ``shape`` is ``spec`` but on ``dynamic_axes``, where any length fits."""
    return len(shape) == len(spec) and all(
        a == b or k in dynamic_axes for k, (a, b) in enumerate(zip(shape, spec))
    )


def _check_dtype(where: str, value: object, dtype: str) -> None:
    if not isinstance(value, np.ndarray):
        raise RunInputError(f"{where}: an array expected, got {type(value).__name__}")
    if value.dtype != np.dtype(dtype):
        raise RunInputError(f"{where}: dtype {value.dtype}, expected {dtype}")


def rel_error(got: object, expected: object) -> float:
    """The largest absolute difference over the largest finite magnitude of ``expected`` (NaN
    against NaN and an infinity against the same one are equal; against a number, ``inf``); for
    integers, bools and strings 1.0 where any element differs; for sequences the worst of their
    tensors (1.0 for another length); for optionals 1.0 where one is empty and the other not."""
    if isinstance(got, list) or isinstance(expected, list):
        if not (isinstance(got, list) and isinstance(expected, list)) or len(got) != len(expected):
            return 1.0
        return max((rel_error(g, e) for g, e in zip(got, expected)), default=0.0)
    if got is None or expected is None:
        return 0.0 if got is None and expected is None else 1.0
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        return 1.0
    if got.size == 0:
        return 0.0
    if got.dtype.kind not in "fc":
        return float(np.any(got != expected))
    wide = np.complex128 if "c" in (got.dtype.kind, expected.dtype.kind) else np.float64
    g, e = got.astype(wide), expected.astype(wide)
    same = (g == e) | (np.isnan(g) & np.isnan(e))  # NaN where both are NaN, inf where both are inf
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(g - e))
    if np.isnan(diff).any():  # a NaN or an infinity against a number
        return float("inf")
    finite = np.abs(e[np.isfinite(e)])
    return float(diff.max()) / max(float(finite.max(initial=0.0)), 1e-12)
