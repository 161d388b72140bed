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

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np
import onnx

from edgesplit.bundle.format import Manifest
from edgesplit.device.throttle import busy
from edgesplit.errors import InputError
from edgesplit.generate.generator import GenerateStats, Generator, Prefill


class PartWorker(Protocol):
    """What the generation needs of the part's worker (:class:`edgesplit.runtime.session`'s)."""

    def in_caller(self) -> AbstractContextManager: ...

    def holding(self) -> AbstractContextManager: ...


__all__ = ["bundle_generator", "pinned_tokens"]


def bundle_generator(
    where: str,
    manifest: Manifest,
    executors: Mapping[str, object],
    read: Callable[[str], bytes],
    options: tuple[int, bool, int | None],
) -> Generator:
    """A :class:`Generator` over the one part of the bundle at ``where`` (its ``manifest``, its
    parts' ``executors``, ``read`` for its files), once the bundle can generate; ``options``:
    (chunk tokens, move the cache, max cache tokens).

    Raises:
        InputError: naming the bundle and why it cannot generate.
    """
    chunk_tokens, move_cache, max_cache_tokens = options
    parts = manifest.parts
    if manifest.bands is not None or len(manifest.replicas) > 1:
        raise InputError(f"{where}: generate needs a plain one-part bundle (no band plans, no "
                         "replicas)")  # fmt: skip
    if len(parts) != 1:
        raise InputError(
            f"{where}: generate needs a one-part bundle for now; this one has {len(parts)} parts "
            "(the cache would cross between parts every step)"
        )
    part = parts[0]
    ort_sess = getattr(executors[part.name], "ort_session", None)
    if part.remote or ort_sess is None:
        raise InputError(
            f"{where}: generate needs a local ONNX Runtime part; part {part.name} runs "
            f"{'on a server' if part.remote else f'on {part.backend}'}"
        )
    proto = onnx.load_model_from_string(read(part.onnx_file))
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
    worker: PartWorker,
    gen: Generator,
    request: tuple[Sequence[int] | np.ndarray, int, int | None, Prefill | None],
    on_done: Callable[[GenerateStats], None],
) -> Iterator[int]:
    """``gen``'s tokens for ``request`` (prompt, new tokens, end token, a prefill to run instead of
    ``gen``'s or None), each step run pinned and
    throttled as the part's ``worker``, holding its cores; ``on_done`` gets the figures once the
    tokens end.

    The request is checked here, before the first token is asked for.
    """
    tokens = gen.generate(*request)
    return _steps(worker, gen, tokens, on_done)


def _steps(
    worker: PartWorker,
    gen: Generator,
    tokens: Iterator[int],
    on_done: Callable[[GenerateStats], None],
) -> Iterator[int]:
    while True:
        with worker.in_caller(), worker.holding(), busy():
            token = next(tokens, None)
        if token is None:
            break
        yield token
    stats: GenerateStats | None = gen.last_stats
    if stats is not None:
        on_done(stats)
