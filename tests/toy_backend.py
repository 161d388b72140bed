"""A toy backend for the registry test: ONNX Runtime with every graph optimisation disabled.

One module and one line per table (see ``register``), as the design asks of a new backend; the
built-in ``ort`` classes take the one setting that differs.
"""

from __future__ import annotations

import onnxruntime as ort

from edgesplit.backends.ort.compiler import OrtCompiler
from edgesplit.backends.ort.executor import OrtExecutor
from edgesplit.backends.ort.profile import OrtProfiler
from edgesplit.device.spec import BackendKind

NAME = "ort-noopt"
UNOPTIMISED = {"graph_optimization_level": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
RUNS: list[str] = []  # the parts this backend's executors ran, in order


class NoOptExecutor(OrtExecutor):
    def __init__(self, part, bundle, *, shares_processor: bool = False, **options):
        super().__init__(
            part, bundle, shares_processor=shares_processor, session_attrs=UNOPTIMISED, **options
        )
        level = self._sess.get_session_options().graph_optimization_level
        assert level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL, level

    def call(self, args):  # the backend's run call (the Session times gather, call, collect apart)
        RUNS.append(self.part.name)
        return super().call(args)


def register() -> list[tuple[dict, str]]:
    """Add the backend to every table; returns (table, key) pairs for ``unregister``."""
    from edgesplit.compile.backends import COMPILERS
    from edgesplit.device.spec import BACKENDS
    from edgesplit.profile.backends import PROFILERS
    from edgesplit.runtime.backends import EXECUTORS

    BACKENDS[NAME] = BackendKind((), "ONNX Runtime without graph optimisations (a test backend)")
    PROFILERS[NAME] = OrtProfiler(**UNOPTIMISED)
    COMPILERS[NAME] = OrtCompiler()
    EXECUTORS[NAME] = NoOptExecutor
    return [(BACKENDS, NAME), (PROFILERS, NAME), (COMPILERS, NAME), (EXECUTORS, NAME)]


def unregister(entries: list[tuple[dict, str]]) -> None:
    for table, key in entries:
        table.pop(key, None)
