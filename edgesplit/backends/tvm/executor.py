"""TVM's executor: a Relax VM over a part's compiled library."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edgesplit.backends.tvm.build import TvmLibrary
from edgesplit.bundle.format import PartArtifact, VerifiedBundle, as_verified
from edgesplit.errors import BundleError
from edgesplit.util import short


class TvmExecutor:
    """A TVM Relax VM over the part's compiled library, loaded from a checked private copy."""

    thread_safe = False  # a VM holds its call frames: one call at a time

    def __init__(
        self,
        part: PartArtifact,
        bundle: VerifiedBundle | Path,
        *,
        shares_processor: bool = False,
        profile_prefix: str | None = None,
    ):
        """``shares_processor``: other parts run on this processor, so TVM's pool threads must not
        spin after a call (``TVM_THREAD_POOL_SPIN_COUNT=0``, read once per process when the pool
        starts; it stops the pool stealing the core from the next part, ORT's or TVM's). TVM has no
        per-kernel profiler here, so ``profile_prefix`` does not apply."""
        self.part = part
        if shares_processor:
            os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        bundle = as_verified(bundle)
        # A checked private copy is what gets mapped: the bundle's own file could change after
        # the check, the copy cannot (and it is removed once loaded; the mapping stays).
        with bundle.private_copy(part.file) as copy:
            try:
                self._lib = TvmLibrary(copy, part.target)
            except LookupError as e:
                raise BundleError(f"part {part.name}: {e}") from e
            except Exception as e:  # noqa: BLE001 - TVM's errors are its own, or bare RuntimeErrors
                raise BundleError(
                    f"{bundle / part.file}: TVM cannot load it ({short(str(e), 200)})"
                ) from e
        self._inputs = [i.name for i in part.inputs]
        self._outputs = [o.name for o in part.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.collect(self.call(self.gather(feeds)))

    def gather(self, feeds: Mapping[str, np.ndarray]) -> list:
        return self._lib.tensors([feeds[k] for k in self._inputs])

    def call(self, args: list):
        return self._lib.call(args)

    def collect(self, raw) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self._lib.outputs(raw)))

    def close(self) -> None:
        self._lib.close()
