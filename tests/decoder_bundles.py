"""Decoder bundles for generation tests, made with the real ``edgesplit compile`` as a user would.

The plan is written in Python (``contiguous_plan`` over host-biglittle's big and little cores, the
model loaded for one decode step after a 4-token cache); the bundle is compiled by the CLI. A
one-part plan of the zoo decoder keeps its sequence and cache lengths dynamic; ``fixed=True``
compiles a copy of the decoder whose file fixes every input shape (a decoder exported for one
step), which compiles, and stays, static.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from conftest import run_cli

from edgesplit.compile.manual import contiguous_plan
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.model.zoo_decoder import SIZES


def step_shapes(name: str, past: int = 4) -> dict[str, tuple[int, ...]]:
    """Input shapes of one decode step of zoo decoder ``name`` after ``past`` cached tokens."""
    c = SIZES[name]
    shapes = {"input_ids": (1, 1), "attention_mask": (1, past + 1), "position_ids": (1, 1)}
    for i in range(c.layers):
        for kv in ("key", "value"):
            shapes[f"past_key_values.{i}.{kv}"] = (1, c.kv_heads, past, c.head_dim)
    return shapes


def _fixed_copy(model: Path, shapes: dict[str, tuple[int, ...]], out: Path) -> Path:
    """``model`` with every graph input's dims written as numbers."""
    proto = onnx.load(model)
    for vi in proto.graph.input:
        for d, n in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
            d.Clear()
            d.dim_value = n
    onnx.save(proto, out)
    return out


def decoder_bundle(root: Path, name: str, parts: int = 1, fixed: bool = False) -> Path:
    """``name`` from the zoo compiled by ``edgesplit compile`` into ``parts`` ORT parts on
    host-biglittle's big and little cores, in ``root/bundle``."""
    root.mkdir(parents=True, exist_ok=True)
    shapes = step_shapes(name)
    model = zoo.save(name, root / f"{name}.onnx")
    if fixed:
        model = _fixed_copy(model, shapes, root / f"{name}_fixed.onnx")
    graph = load_model(model, shapes)
    sites = [("big", "ort"), ("little", "ort")] * parts
    contiguous_plan(graph, "host-biglittle", sites[:parts]).save(root / "plan.json")
    out = root / "bundle"
    r = run_cli("compile", str(model), "--plan", str(root / "plan.json"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    return out
