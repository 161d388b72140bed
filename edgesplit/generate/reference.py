"""Plain ONNX Runtime over a decoder: the one-line alternative that generation is checked against.

:func:`greedy_plain` is what a user writes without edgesplit: the whole prompt in one run, then one
run per token, every cache tensor through numpy. :func:`forward` is one run without a cache (a
full forward pass). Both take the decoder layout of :mod:`edgesplit.model.zoo_decoder`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from edgesplit.model.zoo_decoder import DecoderConfig, config_of, past_key_name, past_value_name


def cache_names(config: DecoderConfig) -> list[tuple[str, str]]:
    """(past input, present output) of every cache tensor, layer by layer, key before value."""
    out = []
    for i in range(config.layers):
        out.append((past_key_name(i), f"present.{i}.key"))
        out.append((past_value_name(i), f"present.{i}.value"))
    return out


def empty_cache(config: DecoderConfig, batch: int = 1) -> dict[str, np.ndarray]:
    """Past inputs holding no positions."""
    shape = (batch, config.kv_heads, 0, config.head_dim)
    return {past: np.zeros(shape, np.float32) for past, _ in cache_names(config)}


def session(model: onnx.ModelProto | bytes | str, threads: int = 0) -> ort.InferenceSession:
    """A CPU session with ORT's defaults (``threads`` 0: ORT chooses)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def forward(sess: ort.InferenceSession, config: DecoderConfig, input_ids: np.ndarray) -> np.ndarray:
    """Logits of every position of ``input_ids`` ``(batch, seq)`` in one run with no past."""
    batch, seq = input_ids.shape
    feeds = {
        "input_ids": input_ids.astype(np.int64),
        "attention_mask": np.ones((batch, seq), np.int64),
        "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
        **empty_cache(config, batch),
    }
    return sess.run(["logits"], feeds)[0]


def greedy_plain(
    sess: ort.InferenceSession,
    config: DecoderConfig,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | None = None,
) -> Iterator[int]:
    """Greedy generation with plain ``InferenceSession.run`` and numpy feeds, one token per
    ``next`` (the first ``next`` runs the prefill).

    Yields:
        The new tokens (the prompt not included), at most ``max_new_tokens``, ending at
        ``eos_token_id`` when it comes.
    """
    names = [o.name for o in sess.get_outputs()]
    past = empty_cache(config)
    ids = np.asarray([list(prompt)], dtype=np.int64)
    done = new = 0
    while new < max_new_tokens:
        seq = ids.shape[1]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, done + seq), np.int64),
            "position_ids": np.arange(done, done + seq, dtype=np.int64)[None],
            **past,
        }
        results = dict(zip(names, sess.run(None, feeds)))
        past = {p: results[q] for p, q in cache_names(config)}
        done += seq
        token = int(results["logits"][0, -1].argmax())
        new += 1
        yield token
        if token == eos_token_id:
            return
        ids = np.asarray([[token]], dtype=np.int64)


def plain_setup(model: onnx.ModelProto, threads: int = 0):
    """(session, config) for :func:`greedy_plain` and :func:`forward`."""
    return session(model, threads), config_of(model)
