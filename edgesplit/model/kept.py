"""Simplified models kept on disk between runs (``<cache>/simplified``, :mod:`edgesplit.cache`).

Folding a model's shape computations (onnxslim) and inferring its shapes costs about 4 ms a node
here: 4.5 s for the 1,000-node ``transformer_large``, every time ``partition``, ``deploy``,
``explain`` or ``calibrate`` loads it. The result depends only on the model, the input shapes and
the code that makes it, so it is kept, keyed by all three: the model's bytes (external data and an
opset upgrade included), the input shapes, and the versions of onnx, onnxslim and onnxruntime
with the source of the loader. A kept file that cannot be read is made again and replaced; a cache
that cannot be written keeps nothing, and loading goes on. The folder holds at most
:data:`MAX_NBYTES`; past it the least recently used files go (:func:`~edgesplit.cache.prune`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError, EncodeError

from edgesplit.cache import KINDS, cache_folder, code_tag, keep, read_kept

MAX_NBYTES = KINDS["simplified"].max_nbytes
"""The most the kept models take on disk; beyond it the least recently used go first."""


@functools.cache
def _code_tag() -> str:
    """The versions and sources whose change makes a different simplified model."""
    return code_tag(
        "edgesplit.model.load",
        "edgesplit.model.simplify",
        "edgesplit.model.upgrade",
        __name__,
        versions=("onnx", "onnxslim", "onnxruntime"),
    )


def kept_path(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], cannot_fold: str | None
) -> Path | None:
    """Where the simplified ``model`` for ``shapes`` is kept; None for one over protobuf's 2 GB (no
    bytes to key it by). Small models are kept too: folding one takes a fraction of a second, but
    importing onnxslim 0.4 s (a 10-node model loaded in a fresh process: 0.85 s, 0.3-0.45 s
    kept)."""
    digest = model_digest(
        model, _code_tag(), [sorted((k, list(v)) for k, v in shapes.items()), cannot_fold]
    )
    return None if digest is None else cache_folder("simplified") / f"{digest}.onnx"


def model_digest(model: onnx.ModelProto, code_tag: str, facts: Any, *extra: bytes) -> str | None:
    """A key for what is made from ``model``: a hash of the code that makes it, ``facts`` (as JSON),
    ``extra`` bytes and the model's bytes; None for a model over protobuf's 2 GB (no bytes to
    hash)."""
    try:
        data = model.SerializeToString(deterministic=True)
    except (EncodeError, ValueError):
        return None
    h = hashlib.sha256(code_tag.encode())
    h.update(json.dumps(facts, sort_keys=True, default=str).encode())
    for b in extra:
        h.update(b)
    h.update(data)
    return h.hexdigest()[:40]


def simplified(
    model: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]],
    cannot_fold: str | None,
    notes: list[str],
    make: Callable[[list[str]], onnx.ModelProto],
) -> onnx.ModelProto:
    """The simplified ``model`` kept for ``shapes``, its notes added to ``notes``; else
    ``make(notes)``'s, kept for the next load."""
    path = kept_path(model, shapes, cannot_fold)
    found = _parsed(read_kept(path)) if path is not None else None
    if found is not None:
        notes.extend(found[1])
        return found[0]
    made: list[str] = []
    slim = make(made)
    notes.extend(made)
    if path is not None:
        with contextlib.suppress(EncodeError, ValueError):
            keep(path, slim.SerializeToString(), {"notes": made}, MAX_NBYTES)
    return slim


def _parsed(found: tuple[bytes, dict] | None) -> tuple[onnx.ModelProto, list[str]] | None:
    """A kept pair as a model and its notes; None when it is not one."""
    if found is None:
        return None
    notes = found[1].get("notes")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        return None
    try:
        model = onnx.load_model_from_string(found[0])
    except (DecodeError, ValueError):
        return None
    return (model, notes) if model.HasField("graph") and model.opset_import else None
