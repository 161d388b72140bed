"""The compiler table: what each backend turns an extracted part into, keyed by backend name.

:func:`edgesplit.compile.build.build_bundle` writes every part's ONNX model into the bundle, then
hands the part to ``COMPILERS[part.backend]``, which returns the artifact that runs it. A new
backend adds one line here (and one in ``device_schema.BACKENDS``, ``profile/backends.py`` and
``runtime/backends.py``); tests may add an entry at run time and remove it after.
"""

from __future__ import annotations

from edgesplit.backends.ort.compiler import OrtCompiler
from edgesplit.backends.tvm.compiler import TvmCompiler
from edgesplit.compile.job import Compiled, CompileJob, Compiler

__all__ = ["COMPILERS", "CompileJob", "Compiled", "Compiler"]


def _reduced() -> Compiler:
    from edgesplit.compile.quantize import ReducedPrecisionCompiler  # imports this module

    return ReducedPrecisionCompiler()


COMPILERS: dict[str, Compiler] = {
    "ort": OrtCompiler(),
    "tvm": TvmCompiler(),
    "ort-int8": _reduced(),
    "ort-fp16": _reduced(),
}
