"""Token generation over a bundle whose model is a decoder: :meth:`Session.generate`.

A bundle of one local ONNX Runtime part that holds the whole decoder is generated from with
:class:`edgesplit.generate.Generator` over that part's own ``InferenceSession``: the KV cache is
bound through IOBinding from one step to the next and never leaves the part's processor (the
copies counted, 0 when it stays). Each step runs on the calling thread, pinned and throttled as the
part's worker, holding its cores.

Refused, with one line naming the bundle (:class:`~edgesplit.errors.InputError`): a bundle of
several parts (their boundaries would carry cache tensors between processors every step; not
built), replicas or band plans, a remote or non-ORT part, a model without ``past_key_values``
inputs, and a part compiled for fixed sequence and cache lengths (``compile`` keeps a decoder's
symbolic lengths only for a one-part fp32 ORT plan of a decoder file that has them; any other part
runs only the one step it was compiled for).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from edgesplit.device.throttle import busy
from edgesplit.errors import InputError
from edgesplit.generate.generator import GenerateStats, Generator

if TYPE_CHECKING:
    from edgesplit.runtime.session import Session, _Worker

__all__ = ["bundle_generator", "pinned_tokens"]


def bundle_generator(
    sess: Session, chunk_tokens: int, move_cache: bool, max_cache_tokens: int | None
) -> Generator:
    """A :class:`Generator` over ``sess``'s one part, once the bundle can generate.

    Raises:
        InputError: naming the bundle and why it cannot generate.
    """
    where = str(sess.path)
    parts = sess.manifest.parts
    if sess.manifest.bands is not None or len(sess.manifest.replicas) > 1:
        raise InputError(f"{where}: generate needs a plain one-part bundle (no band plans, no "
                         "replicas)")  # fmt: skip
    if len(parts) != 1:
        raise InputError(
            f"{where}: generate needs a one-part bundle for now; this one has {len(parts)} parts "
            "(the cache would cross between parts every step)"
        )
    part = parts[0]
    ort_sess = getattr(sess._executors[part.name], "ort_session", None)
    if part.remote or ort_sess is None:
        raise InputError(
            f"{where}: generate needs a local ONNX Runtime part; part {part.name} runs "
            f"{'on a server' if part.remote else f'on {part.backend}'}"
        )
    proto = onnx.load_model_from_string(sess.bundle.read(part.onnx_file))
    names = {i.name for i in proto.graph.input}
    if "input_ids" not in names or not any(n.startswith("past_key_values.") for n in names):
        raise InputError(
            f"{where}: not a decoder: generate needs input_ids and past_key_values.N.key/value "
            f"inputs (the model takes {', '.join(sorted(names))[:120]})"
        )
    fixed = _fixed_lengths(ort_sess)
    if fixed:
        raise InputError(
            f"{where}: part {part.name} was compiled for fixed lengths ({fixed}); generate needs "
            "the sequence and cache lengths dynamic (compile keeps them for a one-part fp32 ORT "
            "plan of a decoder whose file has them)"
        )
    try:
        return Generator(proto, chunk_tokens, 0, move_cache, max_cache_tokens, session=ort_sess)
    except ValueError as e:
        raise InputError(f"{where}: not a decoder in the layout generate takes ({e})") from e


def _fixed_lengths(ort_sess) -> str:
    """The decoder inputs whose sequence or cache length is a fixed number ('' when none)."""
    out = []
    for arg in ort_sess.get_inputs():
        axis = 2 if arg.name.startswith("past_key_values.") else 1
        shape = list(arg.shape)
        if arg.name in ("input_ids", "attention_mask", "position_ids") or axis == 2:
            if len(shape) > axis and isinstance(shape[axis], int):
                out.append(f"{arg.name} {shape}")
    return ", ".join(out[:3]) + (f" and {len(out) - 3} more" if len(out) > 3 else "")


def pinned_tokens(
    sess: Session, gen: Generator, request: tuple[Sequence[int] | np.ndarray, int, int | None]
) -> Iterator[int]:
    """``gen``'s tokens for ``request`` (prompt, new tokens, end token), each step run pinned and
    throttled as the part's worker, holding its cores; the run calls join the part's timings.

    The request is checked here, before the first token is asked for.
    """
    tokens = gen.generate(*request)
    return _steps(sess, sess._workers[sess.manifest.parts[0].processor], gen, tokens)


def _steps(sess: Session, worker: _Worker, gen: Generator, tokens: Iterator[int]):
    while True:
        with worker.in_caller(), worker.holding(), busy():
            token = next(tokens, None)
        if token is None:
            break
        yield token
    stats: GenerateStats | None = gen.last_stats
    if stats is not None:
        sess._times[sess.manifest.parts[0].name].extend(stats.run_ms)
        sess.last_generate_stats = stats
