"""Executors run one part of a bundle: ORT with an execution provider, or a TVM library.

Contract: an executor is built on the thread that will call it (so thread affinity and the cgroup
of a processor's worker apply to the runtime's own threads too); ``run`` takes a dict holding at
least the part's inputs and returns a dict with exactly the part's outputs. The table that picks
one per part is :data:`edgesplit.runtime.backends.EXECUTORS`.

An executor may also offer ``run`` in three phases, which the Session then times apart:
``gather(feeds)`` (pick and convert the inputs), ``call(args)`` (the backend's run call) and
``collect(raw)`` (the outputs as a dict of numpy arrays); ``run`` is ``collect(call(gather(f)))``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from edgesplit.bundle.format import PartArtifact
from edgesplit.errors import BundleError


class Executor(Protocol):
    """Runs one part. Built and called on the processor's worker thread. An executor whose ``run``
    may be called from several threads at once (the offload server's compute threads) says so with
    ``thread_safe = True``; one that does not is called one request at a time there. One whose
    ``run`` raises, before it computes anything, on an input of another element type or shape, or
    a missing one, says so with ``checks_inputs = True``: the Session may then check a request
    after running it (see ``Session.run``)."""

    part: PartArtifact

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def check_io(part: PartArtifact, file: Path, inputs: list, outputs: list) -> None:
    """The manifest's inputs and outputs of ``part`` are those of the loaded model (names, dtypes,
    fixed dimensions, and the dynamic ones symbolic there): an edited manifest is a one-line
    error here, not ORT's at the first run.

    ``inputs``, ``outputs``: ORT's ``NodeArg`` lists (``name``, ``type``, ``shape``).
    """

    strict = any(t.dynamic_axes for t in (*part.inputs, *part.outputs))
    hint = " ('?': any length)" if strict else ""

    def check(specs, args, what: str) -> None:
        have = {a.name: a for a in args}
        for t in specs:
            a = have.get(t.name)
            if a is None:
                raise BundleError(
                    f"{file}: the manifest says part {part.name} has {what} {t.name!r:.60}, which "
                    "the model "
                    f"lacks (it has {', '.join(have)})"
                )
            dtype = _ORT_DTYPES.get(a.type)
            dims = list(a.shape)
            # a dynamic axis is symbolic in the model. In a part with dynamic axes, a fixed input
            # axis is fixed there too; elsewhere a symbolic one (a boundary the extraction could
            # not shape, a length that depends on the values) takes the manifest's length.
            fits = len(dims) == len(t.shape) and all(
                (not isinstance(d, int))
                if k in t.dynamic_axes
                else d == s or (not isinstance(d, int) and not (strict and what == "input"))
                for k, (d, s) in enumerate(zip(dims, t.shape))
            )
            if (dtype is not None and dtype != t.dtype) or not fits:
                raise BundleError(
                    f"{file}: the manifest says {what} {t.name!r:.60} of part {part.name} is "
                    f"{t.dtype} {t.shown()}{hint}, the model has {a.type} {dims}"
                )

    check(part.inputs, inputs, "input")
    check(part.outputs, outputs, "output")
    extra = sorted({a.name for a in inputs} - {t.name for t in part.inputs})
    if extra:
        raise BundleError(
            f"{file}: the model of part {part.name} also needs inputs {', '.join(extra)[:120]}"
        )


def timed(fn: Callable[[], dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3
