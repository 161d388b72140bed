"""Random inputs of the right names, shapes and dtypes, for profiling and checks."""

from __future__ import annotations

import numpy as np

from edgesplit.errors import RunInputError
from edgesplit.model.graph import ModelGraph, TensorInfo


def random_tensor(info: TensorInfo, rng: np.random.Generator) -> np.ndarray:
    """Seeded data for one tensor: normal floats, small integers (safe as indices), coin flips.

    Raises:
        RunInputError: for a dtype with no made-up data (strings); model loading refuses those.
    """
    dtype = np.dtype(info.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(info.shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 8, size=info.shape).astype(dtype)  # small: safe as indices
    if dtype.kind == "b":
        return rng.random(info.shape) < 0.5
    raise RunInputError(f"no random data for tensor '{info.name}' of dtype {dtype}; pass its value")


def random_inputs(
    graph: ModelGraph, seed: int = 0, names: tuple[str, ...] | None = None
) -> dict[str, np.ndarray]:
    """One array per graph input (or per name in ``names``), seeded.

    Inputs whose values decide shapes get the sample values the model was loaded with
    (``graph.sample_inputs``); the others get random data.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for n in names or graph.inputs:
        sample = graph.sample_inputs.get(n)
        out[n] = sample.copy() if sample is not None else random_tensor(graph.tensors[n], rng)
    return out
