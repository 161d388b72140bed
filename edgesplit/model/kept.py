"""Simplified models kept on disk between runs (``<cache>/simplified``, :func:`~edgesplit.util.cache_root`).

Folding a model's shape computations (onnxslim) and inferring its shapes costs about 4 ms a node
here: 4.5 s for the 1,000-node ``transformer_large``, every time ``partition``, ``deploy``,
``explain`` or ``calibrate`` loads it. The result depends only on the model, the input shapes and
the code that makes it, so it is kept, keyed by all three: the model's bytes (external data and an
opset upgrade included), the input shapes, and the versions of onnx, onnxslim and onnxruntime
with the source of the loader. A kept file that cannot be read is made again and replaced; a cache
that cannot be written keeps nothing, and loading goes on. The folder holds at most
:data:`MAX_NBYTES`; past it the least recently used files go (:func:`~edgesplit.util.prune`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError, EncodeError

from edgesplit.util import atomic_write_bytes, atomic_write_text, cache_root, prune, touch

MIN_NODES = 50
"""Models with fewer nodes are not kept: they simplify in a fraction of a second."""

MAX_NBYTES = 2 << 30
"""The most the kept models take on disk; beyond it the least recently used go first."""


@functools.cache
def _code_tag() -> str:
    """The versions and sources whose change makes a different simplified model."""
    from edgesplit.model import load

    h = hashlib.sha256()
    for package in ("onnx", "onnxslim", "onnxruntime"):
        h.update(f"{package}={metadata.version(package)};".encode())
    for file in (load.__file__, __file__):
        h.update(Path(file).read_bytes())
    return h.hexdigest()


def kept_path(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], cannot_fold: str | None
) -> Path | None:
    """Where the simplified ``model`` for ``shapes`` is kept; None for one not worth keeping (under
    :data:`MIN_NODES` nodes, or over protobuf's 2 GB and so without bytes to key it by)."""
    if len(model.graph.node) < MIN_NODES:
        return None
    digest = model_digest(model, _code_tag(), [sorted((k, list(v)) for k, v in shapes.items()), cannot_fold])
    return None if digest is None else cache_root() / "simplified" / f"{digest}.onnx"


def model_digest(model: onnx.ModelProto, code_tag: str, facts: Any, *extra: bytes) -> str | None:
    """A key for what is made from ``model``: a hash of the code that makes it, ``facts`` (as JSON),
    ``extra`` bytes and the model's bytes; None for a model over protobuf's 2 GB (no bytes to hash)."""
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


def read_kept(path: Path) -> tuple[onnx.ModelProto, list[str]] | None:
    """The kept model and the loader's notes on it; None when either file is missing or unreadable."""
    try:
        notes = json.loads(path.with_suffix(".json").read_text())
        model = onnx.load_model_from_string(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, DecodeError):
        return None
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        return None
    if not model.HasField("graph") or not model.opset_import:
        return None
    touch(path, path.with_suffix(".json"))
    return model, notes


def keep(path: Path, model: onnx.ModelProto, notes: list[str]) -> None:
    """Keep ``model`` and its notes at ``path`` (the notes last: they mark the pair complete)."""
    try:
        atomic_write_bytes(path, model.SerializeToString())
        atomic_write_text(path.with_suffix(".json"), json.dumps(notes))
    except (OSError, EncodeError, ValueError):  # a read-only cache, a full disk: nothing is kept
        return
    prune(path.parent, MAX_NBYTES)
