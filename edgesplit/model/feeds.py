"""Made-up inputs of the right names, shapes and dtypes, for profiling and checks.

Inputs given as sample values (``--input NAME=FILE.npy``, ``graph.sample_inputs``) are used as
they are. The others are drawn, seeded: floats from a normal distribution, bools from coin flips,
strings from a few short words, integers from ``[0, 8)``, except where the ops that read an input
accept fewer values (indices within an axis, an axis of a tensor, a divisor that is not 0:
:mod:`edgesplit.model.bounds`). :func:`run_failure` turns a run that fails on made-up values into
a one-line error naming the inputs that were made up, those no rule could fill first.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
from onnx import numpy_helper

from edgesplit.errors import EdgesplitError, RunInputError
from edgesplit.model.bounds import Bounds, constants, draw, input_bounds
from edgesplit.model.graph import ModelGraph, TensorInfo

WORDS = np.array(["monday", "tuesday", "a", "b", "edge", "split", "onnx", ""], dtype=object)


def random_tensor(
    info: TensorInfo, rng: np.random.Generator, bounds: Bounds | None = None
) -> np.ndarray:
    """Seeded data for one tensor: normal floats, small integers, coin flips, short words;
    within ``bounds`` where given.

    Raises:
        RunInputError: for a sequence or optional value (no shape to make one of); pass its value.
    """
    if info.kind != "tensor":
        raise RunInputError(
            f"no made-up value for {info.kind} '{info.name}'; pass its value (--input "
            f"{info.name}=FILE)"
        )
    dtype = np.dtype(info.dtype)
    if bounds is not None and dtype.kind in "iuf":
        made = draw(bounds, info.shape, dtype, rng)
    elif dtype.kind == "f":
        made = rng.standard_normal(info.shape)
    elif dtype.kind in "iu":
        made = rng.integers(0, 8, size=info.shape)
    elif dtype.kind == "b":
        made = rng.random(info.shape) < 0.5
    elif dtype.kind == "O":
        made = WORDS[rng.integers(0, len(WORDS), size=info.shape)]
    else:
        raise RunInputError(
            f"no random data for tensor '{info.name}' of dtype {dtype}; pass its value"
        )
    return np.asarray(made, dtype=dtype)  # an array even of shape (): ORT takes no numpy scalars


def graph_bounds(graph: ModelGraph, names: Sequence[str]) -> dict[str, Bounds | None]:
    """:func:`~edgesplit.model.bounds.input_bounds` of ``names`` in ``graph``."""
    consts = constants(graph.model)

    def shape(t: str) -> tuple[int, ...] | None:
        info = graph.tensors.get(t)
        return info.shape if info is not None and info.kind == "tensor" else None

    def const(t: str) -> np.ndarray | None:
        return numpy_helper.to_array(consts[t]) if t in consts else None

    return input_bounds(graph.model.graph.node, names, shape, const)


def random_inputs(
    graph: ModelGraph, seed: int = 0, names: tuple[str, ...] | None = None
) -> dict[str, np.ndarray]:
    """One value per graph input (or per name in ``names``), seeded.

    Inputs given as sample values when the model was loaded (``graph.sample_inputs``) get them;
    the others get made-up data within the bounds of the ops that read them.
    """
    rng = np.random.default_rng(seed)
    wanted = names or graph.inputs
    bounds = graph_bounds(graph, [n for n in wanted if n not in graph.sample_inputs])
    out = {}
    for n in wanted:
        if n in graph.sample_inputs:
            out[n] = copy.deepcopy(graph.sample_inputs[n])  # an array, a list of them, or None
        else:
            out[n] = random_tensor(graph.tensors[n], rng, bounds.get(n))
    return out


def made_up(graph: ModelGraph) -> list[str]:
    """The graph inputs that get made-up values, those no rule fills first (integers that no op
    bounds, or that an op bounds in a way that cannot be met), then the others."""
    names = [n for n in graph.inputs if n not in graph.sample_inputs]
    bounds = graph_bounds(graph, names)

    def guessed(n: str) -> bool:
        info = graph.tensors[n]
        return (n in bounds and bounds[n] is None) or (
            n not in bounds and info.kind == "tensor" and np.dtype(info.dtype).kind in "iu"
        )

    return sorted(names, key=lambda n: not guessed(n))


def run_failure(graph: ModelGraph, what: str, why: str) -> EdgesplitError:
    """The error for ``what`` (say, "profiling on core0 (ort)") failing with ``why``: where inputs
    were made up, an input error naming them (those no rule could fill first) and the flag that
    gives their values; else a failure while running."""
    names = made_up(graph)
    if not names:
        return EdgesplitError(f"{graph.path}: {what} failed ({why})")
    shown = ", ".join(repr(n) for n in names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else ""
    )
    flags = " ".join(f"--input {n}=FILE.npy" for n in names[:3])
    return RunInputError(
        f"{graph.path}: {what} failed ({why}) on made-up values of input {shown}; give sample "
        f"values: {flags}"
    )
