"""Llama-style decoders of the zoo, with a KV cache in the layout of ONNX Runtime GenAI and Optimum.

A decoder is RMSNorm, rotary position embeddings (RoPE, the "rotate half" form of Hugging Face
transformers), grouped-query attention (``heads`` query heads share ``kv_heads`` key/value heads),
a SwiGLU feed-forward and, by default, an output head tied to the token embedding. It is written
op by op with :mod:`onnx.helper` and takes and returns the cache as separate tensors:

- inputs ``input_ids`` int64 ``(batch, seq)``, ``attention_mask`` int64 ``(batch, past + seq)``,
  ``position_ids`` int64 ``(batch, seq)``, and per layer ``past_key_values.N.key`` /
  ``past_key_values.N.value`` float32 ``(batch, kv_heads, past, head_dim)``;
- outputs ``logits`` float32 ``(batch, seq, vocab)`` and per layer ``present.N.key`` /
  ``present.N.value`` float32 ``(batch, kv_heads, past + seq, head_dim)``.

The one graph serves prefill (``past`` = 0, or a chunk after earlier chunks) and decode (``seq`` =
1). Attention is causal by absolute index within the cache and masks every slot whose
``attention_mask`` is 0, so padded slots (left padding, or a static-shape prefill chunk padded at
its end) never take part. Weights are seeded (:func:`decoder`) or given (:mod:`gguf_decoder`
loads a trained model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgesplit.model.zoo import IR_VERSION, OPSET, _Builder

MASKED = -1.0e9
"""Added to the attention scores of masked slots: finite, so a row with every slot masked (a
padded query) gives a uniform softmax rather than NaN."""


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes of a Llama-style decoder.

    Attributes:
        vocab_size: Tokens in the vocabulary.
        hidden: Model width; divides by ``heads``.
        layers: Decoder layers.
        heads: Query heads; a multiple of ``kv_heads``.
        kv_heads: Key/value heads (grouped-query attention when fewer than ``heads``).
        ffn: Width of the SwiGLU feed-forward.
        rope_theta: Base of RoPE's frequencies.
        rms_eps: RMSNorm's epsilon.
        max_positions: Rows of the RoPE tables: the longest cache the model takes.
        tied: Whether the output head is the token embedding (transposed).
    """

    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_positions: int = 2048
    tied: bool = True

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(
                f"hidden {self.hidden}, heads {self.heads}, kv_heads {self.kv_heads}: hidden must "
                "divide into heads of even width, heads into kv_heads"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def parameters(self) -> int:
        """Weights in the model (the tied head counted once)."""
        kv = self.kv_heads * self.head_dim
        per_layer = (
            2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.ffn
        )
        head = 0 if self.tied else self.vocab_size * self.hidden
        norms = (2 * self.layers + 1) * self.hidden
        return self.vocab_size * self.hidden + self.layers * per_layer + head + norms

    def cache_nbytes(self, tokens: int, batch: int = 1) -> int:
        """Bytes of the float32 KV cache holding ``tokens`` positions."""
        return 2 * self.layers * batch * self.kv_heads * tokens * self.head_dim * 4


SIZES: dict[str, DecoderConfig] = {
    "decoder_tiny": DecoderConfig(256, 64, 2, 4, 2, 176, max_positions=512),
    "decoder_small": DecoderConfig(2048, 256, 4, 8, 2, 704),
    "decoder_100m": DecoderConfig(32000, 768, 12, 12, 4, 2048),
}
"""The zoo's seeded decoders: about 0.1M, 3.3M and 100M parameters."""


def past_key_name(layer: int) -> str:
    return f"past_key_values.{layer}.key"


def past_value_name(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key_name(layer: int) -> str:
    return f"present.{layer}.key"


def present_value_name(layer: int) -> str:
    return f"present.{layer}.value"


def seeded_weights(config: DecoderConfig, seed: int) -> dict[str, np.ndarray]:
    """Random weights in Hugging Face's names and layouts (a linear layer's weight is
    ``(out, in)``), scaled so that activations and logits keep a sensible spread."""
    rng = np.random.default_rng(seed)
    c = config

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def norm() -> np.ndarray:
        return rng.uniform(0.9, 1.1, c.hidden).astype(np.float32)

    kv = c.kv_heads * c.head_dim
    residual = 1.0 / math.sqrt(2 * c.layers)  # GPT-2's scaling of the layers that add to the stream
    w = {"model.embed_tokens.weight": normal((c.vocab_size, c.hidden), 2.0 / math.sqrt(c.hidden))}
    for i in range(c.layers):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm()
        w[f"{p}.self_attn.q_proj.weight"] = normal((c.hidden, c.hidden), 1 / math.sqrt(c.hidden))
        w[f"{p}.self_attn.k_proj.weight"] = normal((kv, c.hidden), 1 / math.sqrt(c.hidden))
        w[f"{p}.self_attn.v_proj.weight"] = normal((kv, c.hidden), 1 / math.sqrt(c.hidden))
        w[f"{p}.self_attn.o_proj.weight"] = normal(
            (c.hidden, c.hidden), residual / math.sqrt(c.hidden)
        )
        w[f"{p}.post_attention_layernorm.weight"] = norm()
        w[f"{p}.mlp.gate_proj.weight"] = normal((c.ffn, c.hidden), 1 / math.sqrt(c.hidden))
        w[f"{p}.mlp.up_proj.weight"] = normal((c.ffn, c.hidden), 1 / math.sqrt(c.hidden))
        w[f"{p}.mlp.down_proj.weight"] = normal((c.hidden, c.ffn), residual / math.sqrt(c.ffn))
    w["model.norm.weight"] = norm()
    if not c.tied:
        w["lm_head.weight"] = normal((c.vocab_size, c.hidden), 2.0 / math.sqrt(c.hidden))
    return w


class _DecoderBuilder(_Builder):
    """The zoo's builder plus the decoder's pieces; weights come from a name -> array table."""

    def __init__(self, config: DecoderConfig, weights: Mapping[str, np.ndarray], name: str):
        super().__init__(name, 0)
        self.c = config
        self.w = weights

    def weight(self, name: str, transpose: bool = False) -> str:
        value = np.asarray(self.w[name], dtype=np.float32)
        return self.tensor(name, np.ascontiguousarray(value.T if transpose else value))

    def linear_nobias(self, x: str, name: str) -> str:
        """``x @ W.T`` with ``W`` stored transposed, ``(in, out)``, as MatMul takes it."""
        return self.node("MatMul", [x, self.weight(f"{name}.weight", True)], name)

    def rmsnorm(self, x: str, name: str) -> str:
        """``x / sqrt(mean(x^2) + eps) * w``, in the pattern ORT fuses (SimplifiedLayerNorm)."""
        sq = self.node("Pow", [x, self.const(2.0)], f"{name}.pow")
        mean = self.node("ReduceMean", [sq], f"{name}.mean", axes=[-1], keepdims=1)
        std = self.node(
            "Sqrt", [self.add(mean, self.const(self.c.rms_eps), f"{name}.eps")], name + ".sqrt"
        )
        y = self.node("Div", [x, std], f"{name}.div")
        return self.node("Mul", [y, self.weight(f"{name}.weight")], name)

    def heads(self, x: str, name: str, heads: int) -> str:
        """``(B, S, heads * dh)`` -> ``(B, heads, S, dh)``."""
        y = self.node(
            "Reshape", [x, self.const([0, 0, heads, self.c.head_dim], np.int64)], f"{name}.split"
        )
        return self.node("Transpose", [y], f"{name}.heads", perm=[0, 2, 1, 3])

    def rope(self, x: str, name: str, cos: str, sin: str) -> str:
        """``x * cos + rotate_half(x) * sin`` on ``(B, H, S, dh)``."""
        half = self.c.head_dim // 2
        axis = self.const([-1], np.int64)
        x1 = self.node(
            "Slice",
            [x, self.const([0], np.int64), self.const([half], np.int64), axis],
            f"{name}.x1",
        )
        x2 = self.node(
            "Slice",
            [x, self.const([half], np.int64), self.const([2 * half], np.int64), axis],
            f"{name}.x2",
        )
        rot = self.concat([self.node("Neg", [x2], f"{name}.neg"), x1], f"{name}.rotate", axis=-1)
        a = self.node("Mul", [x, cos], f"{name}.cos")
        b = self.node("Mul", [rot, sin], f"{name}.sin")
        return self.add(a, b, name)

    def rope_tables(self) -> tuple[str, str]:
        """cos and sin of each position, gathered by ``position_ids``: ``(B, 1, S, dh)`` each."""
        c = self.c
        inv = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
        angles = np.outer(np.arange(c.max_positions, dtype=np.float64), inv)
        out = []
        for fn, table in (("cos", np.cos), ("sin", np.sin)):
            t = self.tensor(f"rope.{fn}_cache", table(angles).astype(np.float32))
            g = self.node("Gather", [t, "position_ids"], f"rope.{fn}.gather")  # (B, S, dh/2)
            g = self.concat([g, g], f"rope.{fn}.full", axis=-1)
            out.append(self.node("Unsqueeze", [g, self.const([1], np.int64)], f"rope.{fn}"))
        return out[0], out[1]

    def scalar(self, value: int) -> str:
        """An int64 scalar (``const`` names a scalar and a 1-element vector alike)."""
        name = f"const.int64.scalar.{value}"
        if not any(t.name == name for t in self.initializers):
            self.tensor(name, np.array(value, dtype=np.int64))
        return name

    def mask_bias(self) -> str:
        """0 where a query may attend a slot, :data:`MASKED` elsewhere: ``(B, 1, G*S, T)`` with
        rows in the grouped-query order of :meth:`attention`."""
        scalar = self.scalar(1)
        seq = self.node(
            "Gather", [self.node("Shape", ["input_ids"], "mask.ids_shape"), scalar], "mask.seq"
        )
        total = self.node(
            "Gather",
            [self.node("Shape", ["attention_mask"], "mask.mask_shape"), scalar],
            "mask.total",
        )
        zero, one = self.scalar(0), self.scalar(1)
        keys = self.node("Range", [zero, total, one], "mask.keys")
        start = self.node("Sub", [total, seq], "mask.start")
        queries = self.node("Range", [start, total, one], "mask.queries")
        keys = self.node("Unsqueeze", [keys, self.const([0], np.int64)], "mask.keys_row")
        queries = self.node("Unsqueeze", [queries, self.const([1], np.int64)], "mask.queries_col")
        causal = self.node("LessOrEqual", [keys, queries], "mask.causal")  # (S, T)
        pad = self.node("Cast", ["attention_mask"], "mask.pad_bool", to=TensorProto.BOOL)
        pad = self.node("Unsqueeze", [pad, self.const([1, 2], np.int64)], "mask.pad")  # (B,1,1,T)
        allowed = self.node("And", [causal, pad], "mask.allowed")  # (B, 1, S, T)
        groups = self.c.heads // self.c.kv_heads
        if groups > 1:
            allowed = self.node(
                "Tile", [allowed, self.const([1, 1, groups, 1], np.int64)], "mask.tile"
            )
        return self.node("Where", [allowed, self.const(0.0), self.const(MASKED)], "mask.bias")

    def attention(self, x: str, i: int, cos: str, sin: str, bias: str) -> str:
        c, p = self.c, f"model.layers.{i}.self_attn"
        q = self.rope(
            self.heads(self.linear_nobias(x, f"{p}.q_proj"), f"{p}.q", c.heads),
            f"{p}.q.rope",
            cos,
            sin,
        )
        k = self.rope(
            self.heads(self.linear_nobias(x, f"{p}.k_proj"), f"{p}.k", c.kv_heads),
            f"{p}.k.rope",
            cos,
            sin,
        )
        v = self.heads(self.linear_nobias(x, f"{p}.v_proj"), f"{p}.v", c.kv_heads)
        k = self.concat([past_key_name(i), k], f"{p}.present_key", axis=2)
        self.nodes[-1].output[0] = k = present_key_name(i)
        v = self.concat([past_value_name(i), v], f"{p}.present_value", axis=2)
        self.nodes[-1].output[0] = v = present_value_name(i)
        # Grouped-query attention without repeating K and V: the G query heads of one KV head are
        # stacked along the sequence axis, (B, H, S, dh) -> (B, KV, G*S, dh).
        dh = c.head_dim
        q = self.node(
            "Reshape", [q, self.const([0, c.kv_heads, -1, dh], np.int64)], f"{p}.q.groups"
        )
        kt = self.node("Transpose", [k], f"{p}.k.t", perm=[0, 1, 3, 2])
        s = self.node("MatMul", [q, kt], f"{p}.scores")
        s = self.node("Mul", [s, self.const(1.0 / math.sqrt(dh))], f"{p}.scale")
        s = self.add(s, bias, f"{p}.masked")
        s = self.node("Softmax", [s], f"{p}.softmax", axis=-1)
        ctx = self.node("MatMul", [s, v], f"{p}.context")
        ctx = self.node(
            "Reshape", [ctx, self.const([0, c.heads, -1, dh], np.int64)], f"{p}.context.heads"
        )
        ctx = self.node("Transpose", [ctx], f"{p}.context.merge", perm=[0, 2, 1, 3])
        ctx = self.node(
            "Reshape", [ctx, self.const([0, 0, c.hidden], np.int64)], f"{p}.context.flat"
        )
        return self.linear_nobias(ctx, f"{p}.o_proj")

    def mlp(self, x: str, i: int) -> str:
        p = f"model.layers.{i}.mlp"
        g = self.linear_nobias(x, f"{p}.gate_proj")
        g = self.node("Mul", [g, self.node("Sigmoid", [g], f"{p}.sigmoid")], f"{p}.silu")
        u = self.linear_nobias(x, f"{p}.up_proj")
        return self.linear_nobias(self.node("Mul", [g, u], f"{p}.gated"), f"{p}.down_proj")


def decoder_from_weights(
    config: DecoderConfig, weights: Mapping[str, np.ndarray], name: str = "decoder", doc: str = ""
) -> onnx.ModelProto:
    """The decoder of ``config`` with ``weights`` in Hugging Face's names (see
    :func:`seeded_weights`); see the module doc for its inputs and outputs."""
    c = config
    b = _DecoderBuilder(c, weights, name)
    x = b.node("Gather", [b.weight("model.embed_tokens.weight"), "input_ids"], "model.embed_tokens")
    cos, sin = b.rope_tables()
    bias = b.mask_bias()
    for i in range(c.layers):
        p = f"model.layers.{i}"
        a = b.attention(b.rmsnorm(x, f"{p}.input_layernorm"), i, cos, sin, bias)
        x = b.add(x, a, f"{p}.attention_residual")
        m = b.mlp(b.rmsnorm(x, f"{p}.post_attention_layernorm"), i)
        x = b.add(x, m, f"{p}.mlp_residual")
    x = b.rmsnorm(x, "model.norm")
    if c.tied:
        head = b.node("Transpose", ["model.embed_tokens.weight"], "lm_head.tied", perm=[1, 0])
    else:
        head = b.weight("lm_head.weight", True)
    b.node("MatMul", [x, head], "lm_head", ["logits"])
    return _finish(b, c, doc)


def _finish(b: _DecoderBuilder, c: DecoderConfig, doc: str) -> onnx.ModelProto:
    f, i64 = TensorProto.FLOAT, TensorProto.INT64

    def cache(n: str, t: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(n, f, ["batch_size", c.kv_heads, t, c.head_dim])

    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", i64, ["batch_size", "total_sequence_length"]
        ),
        helper.make_tensor_value_info("position_ids", i64, ["batch_size", "sequence_length"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f, ["batch_size", "sequence_length", c.vocab_size])
    ]
    for i in range(c.layers):
        inputs += [
            cache(past_key_name(i), "past_sequence_length"),
            cache(past_value_name(i), "past_sequence_length"),
        ]
        outputs += [
            cache(present_key_name(i), "total_sequence_length"),
            cache(present_value_name(i), "total_sequence_length"),
        ]
    graph = helper.make_graph(
        b.nodes, b.graph_name, inputs, outputs, initializer=b.initializers, doc_string=doc
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="edgesplit.zoo",
        ir_version=IR_VERSION,
    )
    # Read by load.py's callers and by genai_config writers: the sizes the graph was built with.
    for key, value in _config_metadata(c).items():
        model.metadata_props.add(key=key, value=value)
    return model


def _config_metadata(c: DecoderConfig) -> dict[str, str]:
    return {
        "edgesplit.decoder.vocab_size": str(c.vocab_size),
        "edgesplit.decoder.hidden": str(c.hidden),
        "edgesplit.decoder.layers": str(c.layers),
        "edgesplit.decoder.heads": str(c.heads),
        "edgesplit.decoder.kv_heads": str(c.kv_heads),
        "edgesplit.decoder.ffn": str(c.ffn),
        "edgesplit.decoder.max_positions": str(c.max_positions),
        "edgesplit.decoder.tied": str(int(c.tied)),
        "edgesplit.decoder.rope_theta": repr(c.rope_theta),
        "edgesplit.decoder.rms_eps": repr(c.rms_eps),
    }


def config_of(model: onnx.ModelProto) -> DecoderConfig:
    """The sizes a decoder was built with, from its metadata or, failing that, its inputs.

    Raises:
        ValueError: when ``model`` has no past key/value inputs in the layout of the module doc.
    """
    meta = {p.key: p.value for p in model.metadata_props}
    if "edgesplit.decoder.layers" in meta:
        g = lambda k: int(meta[f"edgesplit.decoder.{k}"])  # noqa: E731
        return DecoderConfig(
            g("vocab_size"), g("hidden"), g("layers"), g("heads"), g("kv_heads"), g("ffn"),
            max_positions=g("max_positions"), tied=bool(g("tied")),
            rope_theta=float(meta.get("edgesplit.decoder.rope_theta", 10000.0)),
            rms_eps=float(meta.get("edgesplit.decoder.rms_eps", 1e-5)),
        )  # fmt: skip
    return _config_from_inputs(model)


def _config_from_inputs(model: onnx.ModelProto) -> DecoderConfig:
    names = {i.name: i for i in model.graph.input}
    layers = sum(1 for n in names if n.startswith("past_key_values.") and n.endswith(".key"))
    if not layers or "input_ids" not in names:
        raise ValueError("not a decoder with past_key_values.N.key/value inputs and input_ids")
    dims = names[past_key_name(0)].type.tensor_type.shape.dim
    kv_heads, head_dim = dims[1].dim_value, dims[3].dim_value
    logits = next(o for o in model.graph.output if o.name == "logits")
    vocab = logits.type.tensor_type.shape.dim[-1].dim_value
    # Query heads and widths are not visible from the inputs; what the runtime needs is the cache.
    return DecoderConfig(vocab, kv_heads * head_dim, layers, kv_heads, kv_heads, 1)


def decoder(seed: int, config: DecoderConfig, name: str = "decoder") -> onnx.ModelProto:
    """A seeded decoder of ``config``."""
    c = config
    doc = (
        f"Llama-style decoder: {c.layers} layers, d={c.hidden}, {c.heads} heads / {c.kv_heads} KV "
        f"heads, SwiGLU {c.ffn}, vocab {c.vocab_size}, {c.parameters / 1e6:.1f}M parameters; "
        "random weights"
    )
    return decoder_from_weights(c, seeded_weights(c, seed), name, doc)


def decoder_tiny(seed: int = 0) -> onnx.ModelProto:
    return decoder(seed, SIZES["decoder_tiny"], "decoder_tiny")


def decoder_small(seed: int = 0) -> onnx.ModelProto:
    return decoder(seed, SIZES["decoder_small"], "decoder_small")


def decoder_100m(seed: int = 0) -> onnx.ModelProto:
    return decoder(seed, SIZES["decoder_100m"], "decoder_100m")
