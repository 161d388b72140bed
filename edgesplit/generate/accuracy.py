"""Accuracy of a reduced-precision decoder against fp32, measured on held-out prompts.

Every position of every prompt is one sample: the logits that predict the next token. The figures
are :class:`~edgesplit.precision.metrics.Accuracy`'s: logit SNR, cosine, and top-1 agreement of
the next token with fp32's (teacher-forced: both models read the same prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from edgesplit.generate.reference import forward, session
from edgesplit.model.zoo_decoder import config_of
from edgesplit.precision.metrics import Accuracy, compare

HELD_OUT_PROMPTS = (
    "The old lighthouse keeper climbed the stairs every evening to light the lamp, and the ships"
    " that passed in the night never knew his name.",
    "To make bread, mix flour, water, salt and yeast, then knead the dough until it is smooth and"
    " let it rise in a warm place for an hour.",
    "The committee met on Tuesday to discuss the budget for next year, but the meeting ended"
    " before anyone could agree on the numbers.",
    "Photosynthesis is the process by which green plants use sunlight to turn water and carbon"
    " dioxide into sugar and oxygen.",
    "She opened the letter slowly, afraid of what it might say, and read it twice before she"
    " called her brother.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "In 1969, two astronauts walked on the surface of the Moon while a third stayed in orbit.",
    "The recipe calls for two cups of sugar, but I always use a little less because the fruit is"
    " sweet enough.",
)
"""Text the accuracy is measured on: none of it comes from the model's training data that we
know of, and it is never used to choose anything (int4 needs no calibration)."""


def next_token_logits(model: onnx.ModelProto, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per prompt, the logits of every position ``(seq, vocab)``, one full forward pass each."""
    sess, config = session(model), config_of(model)
    return [forward(sess, config, np.asarray([p], np.int64))[0] for p in prompts]


def decoder_accuracy(
    reference: onnx.ModelProto, candidate: onnx.ModelProto, prompts: Sequence[Sequence[int]]
) -> Accuracy:
    """``candidate``'s next-token logits against ``reference``'s on ``prompts`` (token ids)."""
    ref = next_token_logits(reference, prompts)
    got = next_token_logits(candidate, prompts)
    per_position = lambda logits: [{"logits": row[None]} for lg in logits for row in lg]  # noqa: E731
    return compare(per_position(ref), per_position(got))
