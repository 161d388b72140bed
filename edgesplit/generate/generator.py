"""Token generation over a decoder: chunked static-shape prefill, then one token per step.

:class:`Generator` streams greedy tokens (an iterator). The prompt is prefilled in chunks of
``chunk_tokens`` (the last one padded to the same static shape, its padded slots masked out of
attention for good), then each new token is one decode step. The KV cache stays in ONNX Runtime
values bound through IOBinding from one step to the next (:mod:`edgesplit.generate.kv`), and the
figures of the last call (:class:`GenerateStats`) say how long the first token took, how fast
decoding ran and how often the cache was copied between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from edgesplit.errors import InputError
from edgesplit.generate.kv import KVCache
from edgesplit.generate.reference import cache_names
from edgesplit.generate.reference import session as plain_session
from edgesplit.model.zoo_decoder import config_of

DEFAULT_CHUNK_TOKENS = 32

Prefill = Callable[[list[int]], "tuple[KVCache, np.ndarray]"]
"""A prefill run elsewhere: the prompt -> its cache and the logits of its last token."""


@dataclass(frozen=True)
class GenerateStats:
    """Figures of one :meth:`Generator.generate` call.

    Attributes:
        prompt_tokens: Tokens of the prompt.
        new_tokens: Tokens generated.
        prefill_chunks: Runs the prefill took.
        chunk_tokens: Static chunk length (0: the whole prompt in one run).
        ttft_ms: From the call to the first new token.
        decode_ms: From the first new token to the last.
        cache_handoffs: Cache tensors passed from one step to the next.
        cache_copies: Of those, the ones that reached the next step in another buffer.
        cache_copied_nbytes: Bytes those copies moved.
        cache_nbytes: The cache at the end.
        prefill_ms: Each prefill chunk's step (binding, run and reading its logits).
        step_ms: Each decode step after the first token, the same way.
        run_ms: Each run call alone (the chunks', then the steps').
    """

    prompt_tokens: int
    new_tokens: int
    prefill_chunks: int
    chunk_tokens: int
    ttft_ms: float
    decode_ms: float
    cache_handoffs: int
    cache_copies: int
    cache_copied_nbytes: int
    cache_nbytes: int
    prefill_ms: tuple[float, ...] = ()
    step_ms: tuple[float, ...] = ()
    run_ms: tuple[float, ...] = ()

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second of decoding (the first one is prefill's)."""
        steps = self.new_tokens - 1
        return steps / (self.decode_ms / 1e3) if steps > 0 and self.decode_ms > 0 else 0.0


class Generator:
    """Greedy generation over one decoder in the layout of :mod:`edgesplit.model.zoo_decoder`.

    Args:
        model: The decoder (a model, its bytes, or a path).
        chunk_tokens: Static prefill chunk; 0 prefills the whole prompt in one run.
        threads: ORT intra-op threads (0: ORT's default).
        move_cache: Pass the cache through host memory between steps, as a plan that moves it to
            another processor does (the copies are counted).
        max_cache_tokens: The most positions the cache may hold (default: the model's RoPE table).
        session: A CPU session already made on ``model`` (a bundle part's) to run instead of a new
            one; ``threads`` then does not apply.
    """

    def __init__(
        self,
        model: onnx.ModelProto | bytes | str,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        threads: int = 0,
        move_cache: bool = False,
        max_cache_tokens: int | None = None,
        session: ort.InferenceSession | None = None,
    ):
        proto = model if isinstance(model, onnx.ModelProto) else _load(model)
        self.config = config_of(proto)
        self.session: ort.InferenceSession = session or plain_session(proto, threads)
        if chunk_tokens < 0:
            raise InputError(f"chunk_tokens must be 0 or more, not {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        self.move_cache = move_cache
        limit = self.config.max_positions
        self.max_cache_tokens = min(max_cache_tokens or limit, limit)
        self.names = cache_names(self.config)
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.last_stats: GenerateStats | None = None
        self._run_ms: list[float] = []  # run calls of the current generation
        self._prefill_ms: list[float] = []  # its prefill chunks' steps
        self._returned: dict[str, int] = {}  # the present buffers the last step returned

    # -- checks ------------------------------------------------------------------------------

    def check_request(
        self, input_ids: Sequence[int] | np.ndarray, max_new_tokens: int
    ) -> list[int]:
        """The prompt as a list of ints, once every limit holds.

        Raises:
            InputError: naming every problem: a prompt that is empty, not one sequence of
                integers, or holds ids outside the vocabulary; ``max_new_tokens`` not a
                non-negative int; a cache that would grow past ``max_cache_tokens``.
        """
        problems = []
        ids = np.asarray(input_ids)
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            problems.append(
                f"input_ids must be a non-empty sequence of integers (got shape {ids.shape}, "
                f"dtype {ids.dtype})"
            )
        elif ids.min() < 0 or ids.max() >= self.config.vocab_size:
            problems.append(f"input_ids must lie in [0, {self.config.vocab_size})")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
            problems.append(f"max_new_tokens must be an int, not {type(max_new_tokens).__name__}")
        elif max_new_tokens < 0:
            problems.append(f"max_new_tokens must be 0 or more, not {max_new_tokens}")
        elif not problems:
            need = self._slots(len(ids)) + max(int(max_new_tokens) - 1, 0)
            if need > self.max_cache_tokens:
                problems.append(
                    f"the cache would grow to {need} positions ({len(ids)} prompt tokens, "
                    f"{max_new_tokens} new), past the limit of {self.max_cache_tokens}"
                )
        if problems:
            raise InputError("; ".join(problems))
        return [int(t) for t in ids]

    def _slots(self, prompt_tokens: int) -> int:
        c = self.chunk_tokens
        return -(-prompt_tokens // c) * c if c else prompt_tokens

    # -- generation --------------------------------------------------------------------------

    def generate(
        self,
        input_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        prefill: Prefill | None = None,
    ) -> Iterator[int]:
        """Greedy tokens after ``input_ids``, one at a time; :attr:`last_stats` when exhausted.

        ``prefill``: a prefill to run instead of this generator's (a server's, as
        :func:`edgesplit.generate.offload.server_prefill` makes); the decode steps bind the cache
        it returns. Its figures count as one prefill chunk of the whole prompt.

        Raises:
            InputError: from :meth:`check_request`, before anything runs.
        """
        prompt = self.check_request(input_ids, max_new_tokens)
        return self._tokens(prompt, int(max_new_tokens), eos_token_id, prefill)

    def _tokens(
        self, prompt: list[int], max_new: int, eos: int | None, prefill: Prefill | None = None
    ) -> Iterator[int]:
        start = time.perf_counter()
        if prefill is None:
            cache, logits = self.prefill(prompt)
            chunk_tokens = self.chunk_tokens
        else:
            self._returned, self._run_ms = {}, []
            cache, logits = prefill(prompt)
            self._prefill_ms = [(time.perf_counter() - start) * 1e3]
            chunk_tokens = 0
        prefill_ms, step_ms = self._prefill_ms, []
        new, first_ns = 0, time.perf_counter()
        position = len(prompt)
        while new < max_new and logits.size:
            token = int(np.argmax(logits))
            new += 1
            if new == 1:
                first_ns = time.perf_counter()
            yield token
            if token == eos or new == max_new:
                break
            t0 = time.perf_counter()
            logits = self.decode_step(cache, token, position)
            step_ms.append((time.perf_counter() - t0) * 1e3)
            position += 1
        end = time.perf_counter()
        c = cache.counts
        self.last_stats = GenerateStats(
            len(prompt), new, len(prefill_ms), chunk_tokens, (first_ns - start) * 1e3,
            (end - first_ns) * 1e3, c.handoffs, c.copies, c.copied_nbytes, cache.nbytes,
            tuple(prefill_ms), tuple(step_ms), tuple(self._run_ms),
        )  # fmt: skip

    def prefill(self, prompt: list[int]) -> tuple[KVCache, np.ndarray]:
        """A new cache holding ``prompt`` (prefilled in chunks of :attr:`chunk_tokens`) and the
        logits of its last token (empty for an empty prompt). The prompt is not checked (see
        :meth:`check_request`)."""
        cache = KVCache.empty(self.config, self.names)
        self._returned, self._run_ms, self._prefill_ms = {}, [], []
        step = self.chunk_tokens or len(prompt)
        logits = np.empty(0, np.float32)
        for i in range(0, len(prompt), step):
            t0 = time.perf_counter()
            logits = self._step(cache, prompt[i : i + step], step, i)
            self._prefill_ms.append((time.perf_counter() - t0) * 1e3)
        return cache, logits

    def decode_step(self, cache: KVCache, token: int, position: int) -> np.ndarray:
        """One decode step of ``token`` at ``position`` over ``cache`` (which may come from another
        generator's :meth:`prefill`); the next token's logits."""
        return self._step(cache, [token], 1, position)

    def _step(self, cache: KVCache, tokens: list[int], width: int, position: int) -> np.ndarray:
        """One run over ``tokens`` padded to ``width``; the logits of the last real token.

        Positions of real tokens count from ``position`` (padded slots take no position: they are
        masked); a prefill chunk's padded slots stay in the cache, masked, so every later step
        sees the same real tokens at the same positions as an unpadded run.
        """
        real = len(tokens)
        ids = np.zeros((1, width), np.int64)
        ids[0, :real] = tokens
        mask = cache.mask + [1] * real + [0] * (width - real)
        last = self.config.max_positions - 1
        positions = np.minimum(np.arange(position, position + width, dtype=np.int64), last)[None]
        mask_arr = np.asarray([mask], dtype=np.int64)
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", mask_arr)
        binding.bind_cpu_input("position_ids", positions)
        bound = cache.bind(binding)
        cache.check_bound(bound, self._returned)
        for name in self.outputs:
            binding.bind_output(name, cache.device)
        t0 = time.perf_counter()
        self.session.run_with_iobinding(binding)
        self._run_ms.append((time.perf_counter() - t0) * 1e3)
        outs = dict(zip(self.outputs, binding.get_outputs()))
        self._returned = {present: outs[present].data_ptr() for _, present in self.names}
        cache.take(outs, move=self.move_cache)
        cache.mask = mask
        return outs["logits"].numpy()[0, real - 1]


def _load(model: bytes | str) -> onnx.ModelProto:
    try:
        return onnx.load_model_from_string(model) if isinstance(model, bytes) else onnx.load(model)
    except Exception as e:  # noqa: BLE001 - onnx raises plain exceptions of many kinds
        raise InputError(f"not an ONNX model: {type(e).__name__}: {e}") from e
