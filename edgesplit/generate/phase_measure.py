"""Measure a decoder's phases on each processor of a device, and run a phase plan for real.

Each processor gets one worker thread configured as the runtime configures a part's worker
(:func:`edgesplit.device.cpu.configure_as`: pinned to its cores, throttled by its quota), an ONNX
Runtime session built on that thread with the runtime's options
(:func:`edgesplit.device.cpu.ort_session_options`), and every run inside
:func:`edgesplit.device.throttle.busy`, so a throttled processor's duty cycle applies. The
:class:`~edgesplit.generate.Generator` runs the steps, with the cache kept in place.

- :func:`measure_phases` profiles prefill at each chunk size (the mean chunk of a whole prefill
  of a P-token prompt, median over repeats) and decode steps at a few cache lengths (a prompt of
  that length prefilled in one run, then a few steps, median), and a host copy of the cache.
- :func:`run_phases` runs one (prefill processor, chunk, decode processor) choice: prefill on
  the first processor's thread, the cache moved through host memory when the processors differ,
  the decode steps on the second's thread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import onnx
import onnxruntime as ort

from edgesplit.device.cpu import configure_as, ort_session_options
from edgesplit.device.spec import DeviceSpec, Processor
from edgesplit.device.throttle import busy
from edgesplit.errors import InputError
from edgesplit.generate.generator import Generator
from edgesplit.generate.kv import KVCache
from edgesplit.generate.phases import (
    PhaseProfile,
    ProcessorPhases,
    chunk_sizes,
    decode_lengths,
)
from edgesplit.model.zoo_decoder import config_of

T = TypeVar("T")


@dataclass(frozen=True)
class MeasureOptions:
    """How much to measure.

    Attributes:
        chunk_candidates: Prefill chunk sizes to try (those up to the prompt).
        repeats: Measurements per figure (the median is kept).
        decode_steps: Decode steps per measurement at one cache length.
        processors: Names of the processors to measure (default: every local ORT one).
        seed: Of the random prompt.
    """

    chunk_candidates: tuple[int, ...] = (16, 32, 64)
    repeats: int = 3
    decode_steps: int = 3
    processors: tuple[str, ...] | None = None
    seed: int = 0


@dataclass
class ProcessorRunner:
    """One processor's configured worker thread and the session built on it."""

    processor: Processor
    session: ort.InferenceSession
    pool: ThreadPoolExecutor
    notes: list[str] = field(default_factory=list)

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the processor's thread, busy (a throttled processor's duty cycle on)."""

        def run() -> T:
            with busy():
                return fn()

        return self.pool.submit(run).result()

    def generator(self, model: onnx.ModelProto, chunk_tokens: int) -> Generator:
        return Generator(model, chunk_tokens=chunk_tokens, session=self.session)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def phase_processors(spec: DeviceSpec, names: Sequence[str] | None = None) -> list[Processor]:
    """The processors of ``spec`` a whole decoder can run on here: local, with an ORT fp32
    backend (``names``: only those, in that order).

    Raises:
        InputError: a name the spec lacks, or none left.
    """
    usable = {
        p.name: p
        for p in spec.processors
        if p.server is None
        and any(b.key == "ort" for b in p.backends)  # the fp32 ONNX Runtime backend
    }
    if names:
        missing = [n for n in names if n not in usable]
        if missing:
            raise InputError(
                f"{spec.name}: no local ORT processor {', '.join(missing)} "
                f"(it has {', '.join(usable) or 'none'})"
            )
        return [usable[n] for n in names]
    if not usable:
        raise InputError(f"{spec.name}: no local processor runs ONNX Runtime fp32")
    return list(usable.values())


def open_runner(proc: Processor, model: onnx.ModelProto) -> ProcessorRunner:
    """A worker thread configured as ``proc`` and a session built on it."""
    notes: list[str] = []
    pool = ThreadPoolExecutor(
        1, thread_name_prefix=f"edgesplit-{proc.name}", initializer=lambda: notes.extend(
            configure_as(proc)
        ),
    )  # fmt: skip
    throttled = (proc.cpu_quota_pct or 100) < 100 or any(p < 100 for _, p in proc.core_quotas)
    data = model.SerializeToString()

    def build() -> ort.InferenceSession:
        so = ort_session_options(proc.threads, proc.cores, throttled=throttled)
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])

    session = pool.submit(build).result()
    return ProcessorRunner(proc, session, pool, notes)


def random_prompt(vocab_size: int, tokens: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab_size, tokens)]


def measure_processor(
    runner: ProcessorRunner,
    model: onnx.ModelProto,
    workload: tuple[int, int],
    options: MeasureOptions,
) -> ProcessorPhases:
    """One processor's prefill chunk and decode step figures for ``workload`` (P, N)."""
    prompt_tokens, new_tokens = workload
    config = config_of(model)
    chunks = chunk_sizes(prompt_tokens, options.chunk_candidates)
    lengths = decode_lengths(prompt_tokens, new_tokens, chunks)
    longest = max(lengths)
    prompt = random_prompt(config.vocab_size, longest, options.seed)
    runner.call(lambda: list(runner.generator(model, chunks[-1]).generate(prompt[:8], 2)))  # warm
    chunk_ms: dict[int, float] = {}
    for chunk in chunks:
        gen = runner.generator(model, chunk)
        per_run = []
        for _ in range(options.repeats):
            runner.call(lambda gen=gen: list(gen.generate(prompt[:prompt_tokens], 1)))
            per_run.append(statistics.fmean(gen.last_stats.prefill_ms))
        chunk_ms[chunk] = statistics.median(per_run)
    whole = runner.generator(model, 0)
    steps = max(options.decode_steps, 1)
    decode: list[tuple[float, float]] = []
    for length in lengths:
        per_run = []
        for _ in range(options.repeats):
            runner.call(lambda n=length: list(whole.generate(prompt[:n], steps + 1)))
            per_run.append(statistics.median(whole.last_stats.step_ms))
        decode.append((length + (steps - 1) / 2, statistics.median(per_run)))
    return ProcessorPhases(
        runner.processor.name, runner.processor.active_w, chunk_ms, tuple(decode)
    )


def host_copy_gbps(nbytes: int, repeats: int = 5) -> float:
    """Host memory copy bandwidth (GB/s) measured on a buffer of ``nbytes``, the median of
    ``repeats`` copies."""
    src = np.ones(max(nbytes // 4, 1024), np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return src.nbytes / max(statistics.median(times), 1e-9) / 1e9


def cache_nbytes_per_token(model: onnx.ModelProto) -> int:
    c = config_of(model)
    return 2 * c.layers * c.kv_heads * c.head_dim * 4


def measure_phases(
    model: onnx.ModelProto,
    spec: DeviceSpec,
    workload: tuple[int, int],
    options: MeasureOptions | None = None,
    on_note: Callable[[str], None] | None = None,
) -> PhaseProfile:
    """Profile ``model`` (a decoder) per phase on every usable processor of ``spec`` for
    ``workload`` = (prompt tokens P, new tokens N).

    Raises:
        InputError: a model that is not a decoder, a bad workload, or no usable processor.
    """
    options = options or MeasureOptions()
    prompt_tokens, new_tokens = workload
    if prompt_tokens < 1 or new_tokens < 1:
        raise InputError(
            f"prompt and new tokens must be 1 or more, not {prompt_tokens}, {new_tokens}"
        )
    config = config_of(model)
    chunks = chunk_sizes(prompt_tokens, options.chunk_candidates)
    if max(decode_lengths(prompt_tokens, new_tokens, chunks)) + options.decode_steps > (
        config.max_positions
    ):
        raise InputError(
            f"{prompt_tokens} + {new_tokens} tokens (and padding) pass the decoder's "
            f"{config.max_positions} positions"
        )
    figures = []
    for proc in phase_processors(spec, options.processors):
        runner = open_runner(proc, model)
        try:
            for note in runner.notes if on_note else ():
                on_note(note)
            figures.append(measure_processor(runner, model, workload, options))
        finally:
            runner.close()
    per_token = cache_nbytes_per_token(model)
    gbps = host_copy_gbps(per_token * (prompt_tokens + new_tokens + 64))
    name = model.graph.name or "decoder"
    return PhaseProfile(name, spec.name, prompt_tokens, new_tokens, per_token, gbps, tuple(figures))


@dataclass(frozen=True)
class PhaseRun:
    """Measured figures of one generation by a phase plan.

    Attributes:
        ttft_ms: Prefill and the first token, timed on the prefill processor's thread.
        switch_ms: The cache moved through host memory (0 on one processor).
        decode_ms: The decode steps, timed on the decode processor's thread.
        wall_ms: The whole generation from the caller, hand-offs between threads included.
        tokens: The new tokens.
    """

    ttft_ms: float
    switch_ms: float
    decode_ms: float
    wall_ms: float
    tokens: tuple[int, ...]

    @property
    def total_ms(self) -> float:
        return self.ttft_ms + self.switch_ms + self.decode_ms


def move_cache(cache: KVCache) -> None:
    """Copy every cache tensor into a new host buffer, as a move to another processor would."""
    for past, value in cache.values.items():
        host = np.array(value.numpy(), copy=True)
        cache.values[past] = ort.OrtValue.ortvalue_from_numpy(host, cache.device)
        cache.counts.copies += 1
        cache.counts.copied_nbytes += host.nbytes


def run_phases(
    prefill: tuple[ProcessorRunner, Generator],
    decode: tuple[ProcessorRunner, Generator],
    prompt: list[int],
    new_tokens: int,
) -> PhaseRun:
    """Greedy ``new_tokens`` after ``prompt``: prefill by ``prefill`` (runner and its generator,
    whose chunk applies), decode by ``decode``; the cache moves when the runners differ."""
    (pre_runner, pre_gen), (dec_runner, dec_gen) = prefill, decode
    start = time.perf_counter()

    def do_prefill() -> tuple[KVCache, int, float]:
        t0 = time.perf_counter()
        cache, logits = pre_gen.prefill(prompt)
        token = int(np.argmax(logits))
        return cache, token, (time.perf_counter() - t0) * 1e3

    cache, token, ttft_ms = pre_runner.call(do_prefill)
    switch_ms = 0.0
    if dec_runner is not pre_runner:
        t0 = time.perf_counter()
        move_cache(cache)
        switch_ms = (time.perf_counter() - t0) * 1e3
    tokens = [token]
    position = len(prompt)

    def do_decode() -> float:
        nonlocal position
        t0 = time.perf_counter()
        while len(tokens) < new_tokens:
            logits = dec_gen.decode_step(cache, tokens[-1], position)
            position += 1
            tokens.append(int(np.argmax(logits)))
        return (time.perf_counter() - t0) * 1e3

    decode_ms = dec_runner.call(do_decode)
    wall_ms = (time.perf_counter() - start) * 1e3
    return PhaseRun(ttft_ms, switch_ms, decode_ms, wall_ms, tuple(tokens))
