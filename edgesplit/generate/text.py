"""Text to tokens and back with a decoder's vocabulary alone (no tokenizer library).

:func:`encode` splits text into the longest vocabulary entries from the left, GPT-2's byte-level
convention (a leading space is ``Ġ``, a newline ``Ċ``): not the model's BPE merges, so a prompt may
tokenize differently from the model's own tokenizer, but every token is one the model was trained
on and the text reads the same. Enough for held-out prompts and for printing what was generated.
"""

from __future__ import annotations

from collections.abc import Sequence

_TO_VOCAB = {" ": "Ġ", "\n": "Ċ", "\t": "ĉ"}
_FROM_VOCAB = {v: k for k, v in _TO_VOCAB.items()}


def encode(text: str, tokens: Sequence[str], longest: int = 24) -> list[int]:
    """Token ids of ``text``, longest vocabulary match first.

    Raises:
        ValueError: for a character no vocabulary entry starts with.
    """
    index = {t: i for i, t in enumerate(tokens)}
    mapped = "".join(_TO_VOCAB.get(ch, ch) for ch in text)
    out, i = [], 0
    while i < len(mapped):
        for j in range(min(len(mapped), i + longest), i, -1):
            if mapped[i:j] in index:
                out.append(index[mapped[i:j]])
                i = j
                break
        else:
            raise ValueError(f"no token for {mapped[i]!r} at {i}")
    return out


def decode(ids: Sequence[int], tokens: Sequence[str]) -> str:
    """The text of ``ids``."""
    return "".join(_FROM_VOCAB.get(ch, ch) for i in ids for ch in tokens[i])
