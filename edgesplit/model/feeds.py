"""Random inputs of the right names, shapes and dtypes, for profiling and checks."""

from __future__ import annotations

import numpy as np

from edgesplit.model.graph import ModelGraph, TensorInfo


def random_tensor(info: TensorInfo, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(info.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(info.shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 8, size=info.shape).astype(dtype)  # small: safe as indices
    if dtype.kind == "b":
        return rng.random(info.shape) < 0.5
    raise ValueError(f"no random data for dtype {dtype} of '{info.name}'")


def random_inputs(
    graph: ModelGraph, seed: int = 0, names: tuple[str, ...] | None = None
) -> dict[str, np.ndarray]:
    """One random array per graph input (or per name in ``names``), seeded."""
    rng = np.random.default_rng(seed)
    return {n: random_tensor(graph.tensors[n], rng) for n in (names or graph.inputs)}
