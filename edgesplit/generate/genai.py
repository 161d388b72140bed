"""ONNX Runtime GenAI over the zoo's decoders: the baseline that :class:`Generator` is measured
against.

`onnxruntime-genai <https://pypi.org/project/onnxruntime-genai/>`_ loads a folder that holds an
ONNX decoder and its ``genai_config.json``. :func:`write_genai_folder` writes that folder for a
decoder in the layout of :mod:`edgesplit.model.zoo_decoder` (the names GenAI's own exporter uses:
``past_key_values.%d.key`` in, ``present.%d.key`` out), so that GenAI runs the very same graph
and weights. :class:`GenAIGenerator` runs GenAI's greedy search from token ids (no tokenizer: it
takes ids through ``Generator.append_tokens``) and times it as :class:`Generator` times itself.

``past_present_share_buffer`` is off: the graph appends the cache with ``Concat``, so past and
present cannot share one buffer (that needs ``GroupQueryAttention``). GenAI loads the library of
the installed ``onnxruntime`` package, the one edgesplit's sessions use.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from edgesplit.errors import InputError
from edgesplit.model.zoo_decoder import DecoderConfig, config_of
from edgesplit.util import atomic_write_bytes, atomic_write_text, dump_json

MODEL_FILE = "model.onnx"
CONFIG_FILE = "genai_config.json"


def genai_config(
    config: DecoderConfig,
    eos_token_id: int | Sequence[int] | None = None,
    bos_token_id: int = 0,
    pad_token_id: int | None = None,
    threads: int = 0,
    filename: str = MODEL_FILE,
) -> dict:
    """The ``genai_config.json`` of a zoo decoder for GenAI's CPU provider and greedy search.

    Args:
        config: The decoder's sizes.
        eos_token_id: The id (or ids) that end generation; None: none does.
        bos_token_id: Written because GenAI reads it; never prepended (ids go in as given).
        pad_token_id: Default: the first end id, else 0.
        threads: ORT intra-op threads of GenAI's session (0: ORT's default).
        filename: The ONNX file beside the config.
    """
    eos = [] if eos_token_id is None else eos_token_id
    eos_list = [eos] if isinstance(eos, int) else list(eos)
    if pad_token_id is None:
        pad_token_id = eos_list[0] if eos_list else 0
    session_options: dict = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        session_options["intra_op_num_threads"] = int(threads)
    return {
        "model": {
            "type": "llama",
            "bos_token_id": int(bos_token_id),
            "eos_token_id": eos if isinstance(eos, int) else eos_list,
            "pad_token_id": int(pad_token_id),
            "vocab_size": config.vocab_size,
            "context_length": config.max_positions,
            "decoder": {
                "session_options": session_options,
                "filename": filename,
                "head_size": config.head_dim,
                "hidden_size": config.hidden,
                "num_attention_heads": config.heads,
                "num_hidden_layers": config.layers,
                "num_key_value_heads": config.kv_heads,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "top_k": 1,
            "temperature": 1.0,
            "repetition_penalty": 1.0,
            "min_length": 0,
            "max_length": config.max_positions,
            "past_present_share_buffer": False,
        },
    }


def write_genai_folder(
    model: onnx.ModelProto | str | os.PathLike,
    folder: str | os.PathLike,
    eos_token_id: int | Sequence[int] | None = None,
    threads: int = 0,
) -> Path:
    """Write ``folder/model.onnx`` (unless ``model`` is already that file) and
    ``folder/genai_config.json``; returns the folder.

    Raises:
        InputError: when ``model`` is not a decoder in the layout of
            :mod:`edgesplit.model.zoo_decoder`.
    """
    out = Path(folder)
    target = out / MODEL_FILE
    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        proto = onnx.load(str(model), load_external_data=False)
    try:
        config = config_of(proto)
    except ValueError as e:
        raise InputError(f"not a decoder GenAI can run: {e}") from e
    cfg = genai_config(config, eos_token_id, threads=threads)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(model, onnx.ModelProto):
        atomic_write_bytes(target, proto.SerializeToString())
    elif Path(model).resolve() != target.resolve():
        atomic_write_bytes(target, onnx.load(str(model)).SerializeToString())
    atomic_write_text(out / CONFIG_FILE, dump_json(cfg))
    return out


@dataclass(frozen=True)
class GenAIRun:
    """The tokens and timings of one GenAI generation.

    Attributes:
        tokens: The new tokens (the prompt not included).
        ttft_ms: From creating GenAI's generator to the first new token (prefill included).
        decode_ms: From the first new token to the last.
    """

    tokens: list[int]
    ttft_ms: float
    decode_ms: float

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second of decoding (the first one is prefill's)."""
        steps = len(self.tokens) - 1
        return steps / (self.decode_ms / 1e3) if steps > 0 and self.decode_ms > 0 else 0.0


class GenAIGenerator:
    """Greedy generation with ONNX Runtime GenAI over a folder from :func:`write_genai_folder`.

    Args:
        folder: The folder holding ``model.onnx`` and ``genai_config.json``.
    """

    def __init__(self, folder: str | os.PathLike):
        import onnxruntime_genai as og

        self._og = og
        self.folder = Path(folder)
        self.model = og.Model(str(self.folder))

    def stream(self, input_ids: Sequence[int], max_new_tokens: int) -> Iterator[int]:
        """GenAI's greedy tokens after ``input_ids``, one at a time (the first ``next`` runs the
        prefill), stopping at an end id or ``max_new_tokens``.

        Raises:
            InputError: for an empty prompt or a negative ``max_new_tokens`` (before anything
                runs).
        """
        prompt = np.asarray(list(input_ids), dtype=np.int32)
        if prompt.ndim != 1 or prompt.size == 0 or max_new_tokens < 0:
            raise InputError("a non-empty prompt and max_new_tokens >= 0 are needed")
        return self._tokens(prompt, int(max_new_tokens))

    def _tokens(self, prompt: np.ndarray, max_new: int) -> Iterator[int]:
        if max_new == 0:
            return
        og = self._og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=int(prompt.size + max_new))
        gen = og.Generator(self.model, params)
        gen.append_tokens(prompt)
        while not gen.is_done():
            gen.generate_next_token()
            yield int(gen.get_next_tokens()[0])

    def generate(self, input_ids: Sequence[int], max_new_tokens: int) -> GenAIRun:
        """:meth:`stream`'s tokens, all of them, with their timings."""
        start = time.perf_counter()
        stream = self.stream(input_ids, max_new_tokens)
        tokens: list[int] = []
        first = start
        for token in stream:
            tokens.append(token)
            if len(tokens) == 1:
                first = time.perf_counter()
        end = time.perf_counter() if tokens else start
        return GenAIRun(tokens, (first - start) * 1e3, (end - first) * 1e3)


def version() -> str:
    """The installed onnxruntime-genai's version."""
    import onnxruntime_genai as og

    return og.__version__
