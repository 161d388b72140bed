"""Decoder bundles for generation tests, made with ``compile_bundle`` as a user would.

``compile`` folds shapes for the input shapes it is given (one decode step here), so a compiled
part runs only that step. :func:`decoder_bundle` with ``dynamic=True`` then puts the zoo decoder
itself (dynamic sequence and cache lengths) in the one part's place and writes its checksum into
the manifest: the bundle a compile that keeps a decoder's lengths dynamic would make.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from edgesplit.compile.manual import contiguous_plan
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.model.zoo_decoder import SIZES
from edgesplit.workflows.compile import compile_bundle


def decoder_bundle(root: Path, name: str, parts: int = 1, dynamic: bool = True) -> Path:
    """``name`` from the zoo compiled into ``parts`` ORT parts on host-biglittle's big and little
    cores, in ``root/bundle``; ``dynamic``: the one part swapped for the dynamic decoder."""
    c = SIZES[name]
    model = zoo.save(name, root / f"{name}.onnx")
    shapes = {"input_ids": (1, 1), "attention_mask": (1, 5), "position_ids": (1, 1)}
    for i in range(c.layers):
        for kv in ("key", "value"):
            shapes[f"past_key_values.{i}.{kv}"] = (1, c.kv_heads, 4, c.head_dim)
    graph = load_model(model, shapes)
    sites = [("big", "ort"), ("little", "ort")] * parts
    out = root / "bundle"
    compile_bundle(graph, contiguous_plan(graph, "host-biglittle", sites[:parts]), out)
    if dynamic and parts == 1:
        data = model.read_bytes()
        manifest = json.loads((out / "manifest.json").read_text())
        (part,) = manifest["parts"]
        (out / part["onnx_file"]).write_bytes(data)
        manifest["files"][part["onnx_file"]] = hashlib.sha256(data).hexdigest()
        (out / "manifest.json").write_text(json.dumps(manifest))
    return out
