"""Generative decoders: greedy token generation with a KV cache kept in place between steps.

- :mod:`~edgesplit.generate.reference`: plain ONNX Runtime loops (the baseline and the check);
- :mod:`~edgesplit.generate.kv`: the cache between steps, its hand-offs and copies counted;
- :mod:`~edgesplit.generate.generator`: :class:`Generator`, chunked prefill then decode.

The decoders' layout (``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.N.key/value`` -> ``logits``, ``present.N.key/value``) is that of
:mod:`edgesplit.model.zoo_decoder`, ONNX Runtime GenAI's and Optimum's.
"""

from __future__ import annotations

from edgesplit.generate.generator import DEFAULT_CHUNK_TOKENS, GenerateStats, Generator

__all__ = ["DEFAULT_CHUNK_TOKENS", "GenerateStats", "Generator"]
