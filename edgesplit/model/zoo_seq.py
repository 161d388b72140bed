"""Sequence models of the zoo: a BERT-style encoder of primitive ops (two sizes) and an LSTM/GRU.

The encoder spells attention out op by op (Q, K, V projections, Reshape and Transpose to heads,
``Q @ K^T``, Div by sqrt(head dim), Softmax, ``@ V``, merge heads, output projection, residual,
LayerNormalization, GELU feed-forward), as an exporter without fused kernels would, so a
partitioner sees every cut point a real exported transformer has.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from edgesplit.model.zoo import _Builder

LARGE_LAYERS = 32
"""Layers of ``transformer_large``: enough for 1,000+ nodes after onnxslim's fusions."""


def _gelu(b: _Builder, x: str, name: str) -> str:
    """Exact GELU, ``x * 0.5 * (1 + erf(x / sqrt(2)))``, in ops that opset 17 has."""
    y = b.node("Div", [x, b.const(math.sqrt(2.0))], f"{name}.div")
    y = b.node("Erf", [y], f"{name}.erf")
    y = b.node("Add", [y, b.const(1.0)], f"{name}.add")
    y = b.node("Mul", [x, y], f"{name}.mul")
    return b.node("Mul", [y, b.const(0.5)], name)


def _attention(b: _Builder, x: str, name: str, seq: int, d: int, heads: int) -> str:
    dh = d // heads
    split = b.const([1, seq, heads, dh], np.int64)

    def to_heads(role: str, perm: list[int]) -> str:
        y = b.linear(x, f"{name}.{role}", d, d)
        y = b.node("Reshape", [y, split], f"{name}.{role}.split")  # (1, seq, heads, dh)
        return b.node("Transpose", [y], f"{name}.{role}.heads", perm=perm)

    q = to_heads("query", [0, 2, 1, 3])  # (1, heads, seq, dh)
    k = to_heads("key", [0, 2, 3, 1])  # (1, heads, dh, seq): already transposed for Q @ K^T
    v = to_heads("value", [0, 2, 1, 3])
    s = b.node("MatMul", [q, k], f"{name}.scores")
    s = b.node("Div", [s, b.const(math.sqrt(dh))], f"{name}.scale")
    p = b.node("Softmax", [s], f"{name}.softmax", axis=-1)
    ctx = b.node("MatMul", [p, v], f"{name}.context")
    ctx = b.node("Transpose", [ctx], f"{name}.context.merge", perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, b.const([1, seq, d], np.int64)], f"{name}.context.flat")
    # A small output projection: with full-scale random weights, attention's averaging makes all
    # tokens alike within a few dozen post-LN layers ("rank collapse"); trained models do not.
    return b.linear(ctx, f"{name}.output", d, d, gain=0.1)


def _encoder_layer(b: _Builder, x: str, name: str, seq: int, d: int, heads: int, ffn: int) -> str:
    """One post-LN BERT layer: ``LN(x + MHA(x))`` then ``LN(h + FFN(h))``."""
    a = _attention(b, x, f"{name}.attention", seq, d, heads)
    h = b.layernorm(b.add(x, a, f"{name}.attention.residual"), f"{name}.attention.norm", d)
    f = _gelu(b, b.linear(h, f"{name}.ffn.up", d, ffn, gain=2.0), f"{name}.ffn.gelu")
    f = b.linear(f, f"{name}.ffn.down", ffn, d)
    return b.layernorm(b.add(h, f, f"{name}.ffn.residual"), f"{name}.ffn.norm", d)


def encoder(
    seed: int,
    *,
    layers: int,
    seq: int,
    d: int,
    heads: int,
    ffn: int,
    graph_name: str = "transformer",
) -> onnx.ModelProto:
    """A BERT-style encoder over precomputed embeddings.

    Args:
        seed: Weight seed.
        layers: Encoder layers.
        seq: Sequence length (static).
        d: Model width; must divide by ``heads``.
        heads: Attention heads.
        ffn: Feed-forward width.
        graph_name: Name of the ONNX graph.

    Returns:
        A model with input ``input`` and output ``hidden``, both float32 ``(1, seq, d)``.
    """
    if d % heads:
        raise ValueError(f"d={d} does not divide into {heads} heads")
    b = _Builder(graph_name, seed)
    x = "input"
    for i in range(layers):
        x = _encoder_layer(b, x, f"encoder.layer.{i}", seq, d, heads, ffn)
    b.node("Identity", [x], "encoder.output", ["hidden"])
    doc = (
        f"BERT-style encoder: {layers} layers, d={d}, {heads} heads, ffn {ffn}, seq {seq}; "
        "random weights"
    )
    return b.model({"input": (1, seq, d)}, {"hidden": (1, seq, d)}, doc)


def transformer(seed: int = 0) -> onnx.ModelProto:
    """BERT-style encoder: 4 layers, d_model 256, 4 heads, FFN 1024; ``input``/``hidden``
    1x128x256."""
    return encoder(seed, layers=4, seq=128, d=256, heads=4, ffn=1024, graph_name="transformer")


def transformer_large(seed: int = 0) -> onnx.ModelProto:
    """A deep, narrow encoder (:data:`LARGE_LAYERS` layers, d 128, seq 64) with over 1,000 nodes.

    Many nodes but few FLOPs: it exercises the partitioner's scaling, not the processors.
    """
    return encoder(
        seed, layers=LARGE_LAYERS, seq=64, d=128, heads=4, ffn=256, graph_name="transformer_large"
    )


def lstm(seed: int = 0) -> onnx.ModelProto:
    """A recurrent classifier: LSTM(128), GRU(128), the last step's hidden state, Gemm to 10.

    Input ``input`` 1x32x64 (batch, seq, feature), output ``logits`` 1x10.
    """
    batch, seq, feat, hidden, classes = 1, 32, 64, 128, 10
    b = _Builder("lstm", seed)
    bound = 1.0 / math.sqrt(hidden)  # PyTorch's default recurrent init
    x = b.node("Transpose", ["input"], "to_seq_major", perm=[1, 0, 2])  # (seq, batch, feat)
    w = b.uniform("lstm.W", (1, 4 * hidden, feat), -bound, bound)
    r = b.uniform("lstm.R", (1, 4 * hidden, hidden), -bound, bound)
    bias = b.uniform("lstm.B", (1, 8 * hidden), -bound, bound)
    y = b.node(
        "LSTM", [x, w, r, bias], "lstm", ["lstm.Y"], hidden_size=hidden
    )  # (seq, 1, batch, hidden)
    y = b.node("Squeeze", [y, b.const([1], np.int64)], "lstm.squeeze")  # (seq, batch, hidden)
    w = b.uniform("gru.W", (1, 3 * hidden, hidden), -bound, bound)
    r = b.uniform("gru.R", (1, 3 * hidden, hidden), -bound, bound)
    bias = b.uniform("gru.B", (1, 6 * hidden), -bound, bound)
    # Only Y_h, the hidden state after the last step, is needed: the sequence output stays unnamed.
    b.node(
        "GRU", [y, w, r, bias], "gru", ["", "gru.Y_h"], hidden_size=hidden, linear_before_reset=1
    )
    h = b.node("Reshape", ["gru.Y_h", b.const([batch, hidden], np.int64)], "last_step")
    b.gemm(h, "fc", hidden, classes, output="logits")
    return b.model(
        {"input": (batch, seq, feat)}, {"logits": (batch, classes)}, "LSTM + GRU classifier"
    )
