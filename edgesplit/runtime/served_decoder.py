"""A served decoder part: prefill requests, their last logits, and a limit on the cache.

A bundle part that holds a whole decoder with its sequence and cache lengths dynamic (inputs
``input_ids``, ``attention_mask``, ``position_ids`` and ``past_key_values.N.key/value``, listed as
``dynamic_axes`` in the manifest) is served like any part, at any length, and a device offloads its
prefill with one request: the prompt with an empty past in, the cache out
(:mod:`edgesplit.generate.offload`). Two things are added for it:

- the output :data:`LAST_LOGITS`, ``(batch, vocab)``: the logits of the last position only, so a
  prefill answer carries the cache and one row of logits, not a row per prompt token;
- checks of what ORT would otherwise fail on inside the run (a 500): the lengths must agree
  (``input_ids`` and ``position_ids`` ``(batch, seq)``, ``attention_mask`` ``(batch, past + seq)``,
  every past ``(batch, kv_heads, past, head_dim)``), ids must lie in the vocabulary and positions
  in the model's table, and the cache the request makes (batch x (past + seq) positions) must fit
  the server's ``max_cache_tokens`` (``serve --max-cache-tokens``; default: the model's positions).
  A request past the limit is refused, by its declared shapes, before its tensors are read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgesplit.bundle.format import PartArtifact
from edgesplit.errors import RunInputError

LAST_LOGITS = "last_logits"
"""The extra output of a served decoder: the logits of each sequence's last position."""

IDS, MASK, POSITIONS = "input_ids", "attention_mask", "position_ids"
PAST_PREFIX = "past_key_values."


@dataclass(frozen=True)
class DecoderServing:
    """What the server knows of a decoder part, and the limits it holds requests to.

    Attributes:
        vocab_size: Ids are in ``[0, vocab_size)``.
        max_positions: Positions are in ``[0, max_positions)`` (the model's RoPE table).
        max_cache_tokens: A request's cache, batch x (past + seq) positions, at most this.
        past_names: The past key/value inputs.
    """

    vocab_size: int
    max_positions: int
    max_cache_tokens: int
    past_names: tuple[str, ...]

    def check_shapes(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """Refuse lengths that disagree, or a cache past the limit (shapes only: a request is
        checked by what its header declares before its tensors arrive).

        Raises:
            RunInputError: naming the lengths.
        """
        ids, mask, pos = shapes[IDS], shapes[MASK], shapes[POSITIONS]
        batch, seq = ids[0], ids[1]
        pasts = {tuple(shapes[n]) for n in self.past_names}
        past_lengths = sorted({s[2] for s in pasts})
        problems = []
        if seq < 1:
            problems.append("input_ids holds no token")
        if len(past_lengths) > 1:
            problems.append(f"the past tensors hold different lengths {past_lengths[:4]}")
        past = past_lengths[0] if past_lengths else 0
        if any(s[0] != batch for s in (mask, pos, *pasts)):
            problems.append(f"the inputs disagree on the batch (input_ids has {batch})")
        if tuple(pos[:2]) != (batch, seq):
            problems.append(f"position_ids is {list(pos)}, input_ids {list(ids)}")
        if mask[1] != past + seq:
            problems.append(
                f"attention_mask covers {mask[1]} positions, the past ({past}) + input_ids "
                f"({seq}) make {past + seq}"
            )
        if problems:
            raise RunInputError("decoder request: " + "; ".join(problems))
        cache = batch * (past + seq)
        if cache > self.max_cache_tokens:
            raise RunInputError(
                f"decoder request: the cache would hold {cache} positions (batch {batch} x "
                f"({past} past + {seq} new)), past this server's limit of "
                f"{self.max_cache_tokens} (serve --max-cache-tokens)"
            )

    def check_values(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Refuse ids outside the vocabulary and positions outside the model's table.

        Raises:
            RunInputError: naming the range.
        """
        self.check_shapes({k: v.shape for k, v in feeds.items()})
        ids, pos = feeds[IDS], feeds[POSITIONS]
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise RunInputError(f"decoder request: input_ids must lie in [0, {self.vocab_size})")
        if pos.size and (pos.min() < 0 or pos.max() >= self.max_positions):
            raise RunInputError(
                f"decoder request: position_ids must lie in [0, {self.max_positions})"
            )


def decoder_serving(
    part: PartArtifact, metadata: Mapping[str, str], max_cache_tokens: int | None
) -> DecoderServing | None:
    """The decoder view of ``part`` (``metadata``: its ONNX model's metadata properties), when it
    is a decoder whose sequence and cache lengths are dynamic; else None.

    The model's positions come from its ``edgesplit.decoder.max_positions`` property, or else from
    ``max_cache_tokens``, or else 2048.
    """
    inputs = {t.name: t for t in part.inputs}
    outputs = {t.name: t for t in part.outputs}
    pasts = tuple(n for n in inputs if n.startswith(PAST_PREFIX))
    if not {IDS, MASK, POSITIONS} <= set(inputs) or not pasts or "logits" not in outputs:
        return None
    if 1 not in inputs[IDS].dynamic_axes or any(2 not in inputs[n].dynamic_axes for n in pasts):
        return None  # compiled for fixed lengths: served as the step it was compiled for
    rank_ok = len(inputs[IDS].shape) == 2 and all(len(inputs[n].shape) == 4 for n in pasts)
    if not rank_ok or len(outputs["logits"].shape) != 3:
        return None
    table = metadata.get("edgesplit.decoder.max_positions")
    positions = int(table) if table and table.isdigit() else (max_cache_tokens or 2048)
    return DecoderServing(
        int(outputs["logits"].shape[-1]),
        positions,
        min(max_cache_tokens or positions, positions),
        pasts,
    )
