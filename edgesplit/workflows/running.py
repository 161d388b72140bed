"""``run``: a bundle run and timed, its outputs and trace written where asked.

:func:`run_bundle` is what ``edgesplit run`` runs: a plain bundle is benchmarked
(:func:`edgesplit.runtime.harness.benchmark`); an adaptive bundle run with ``adaptive`` switches its
band plans between requests by the measured uplink.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgesplit.runtime.harness import RunReport

__all__ = [
    "BandRun",
    "GenerateRequest",
    "GenerateRun",
    "RunFiles",
    "RunRequest",
    "generate_bundle",
    "run_bundle",
]


@dataclass(frozen=True)
class RunFiles:
    """What a run writes besides its report (each optional).

    Attributes:
        output: A folder to write the outputs to, as ``NAME.npy``.
        trace: A Chrome trace file to write, aligned to the timed request ``trace_request``;
            ``trace_detail`` adds CPU time per run call and ORT kernels.
    """

    output: str | os.PathLike | None = None
    trace: str | os.PathLike | None = None
    trace_detail: bool = False
    trace_request: int = 0


@dataclass(frozen=True)
class RunRequest:
    """How a bundle is run.

    Attributes:
        inputs: ``NAME=FILE.npy`` values (default: random).
        repeat, warmup: Timed runs, and untimed runs before them.
        stream: Also run a pipelined stream of this many requests (0: none).
        executor_options: Options of the executors (``{"remote": {"url": ...}}`` for a server).
        adaptive: Switch band plans by the measured uplink, or choose server or local fallback
            per remote part by measurement.
        trust_key: Load the bundle only if signed by this ed25519 public key.
        files: The outputs and the trace to write.
    """

    inputs: Sequence[str] = ()
    repeat: int = 20
    warmup: int = 3
    stream: int = 0
    executor_options: Mapping[str, Any] | None = None
    adaptive: bool = False
    trust_key: str | os.PathLike | None = None
    files: RunFiles = RunFiles()


@dataclass(frozen=True)
class BandRun:
    """An adaptive bundle's run: the band statistics and the timed requests' latency."""

    stats: Any
    median_ms: float
    p90_ms: float
    runs: int


def run_bundle(bundle: str | os.PathLike, request: RunRequest) -> RunReport | BandRun:
    """Run ``bundle`` as ``request`` says; a :class:`BandRun` for an adaptive bundle run with
    ``adaptive``, else the benchmark's report.

    Raises:
        EdgesplitError: for a bundle that cannot be loaded or run.
    """
    from edgesplit.bundle.format import open_bundle
    from edgesplit.runtime.harness import benchmark, load, read_inputs

    r, files = request, request.files
    if r.adaptive and open_bundle(bundle, verify=False).bands is not None:
        return _run_bands(bundle, r)
    options = dict(r.executor_options) if r.executor_options is not None else None
    with load(
        bundle,
        executor_options=options,
        adaptive=r.adaptive,
        detailed=files.trace_detail,
        trust_key=r.trust_key,
    ) as sess:
        feeds = read_inputs(sess, r.inputs)
        report = benchmark(sess, feeds, repeat=r.repeat, warmup=r.warmup, stream=r.stream)
        if files.output:
            report.save_outputs(files.output)
        if files.trace:
            from edgesplit.runtime.chrome import write_chrome_trace

            align = sorted(q.request for q in report.trace.requests)[files.trace_request]
            write_chrome_trace(files.trace, report.trace, sess.manifest, align_request=align)
    return report


def _run_bands(bundle: str | os.PathLike, r: RunRequest) -> BandRun:
    import time

    import numpy as np

    from edgesplit.runtime.bands import load_bands
    from edgesplit.runtime.harness import read_inputs

    options = dict(r.executor_options) if r.executor_options is not None else None
    with load_bands(bundle, executor_options=options, trust_key=r.trust_key) as bs:
        feeds = read_inputs(bs.sessions[0], r.inputs)
        for _ in range(r.warmup):
            bs.run(feeds)
        lat = []
        for _ in range(r.repeat):
            t0 = time.perf_counter()
            out = bs.run(feeds)
            lat.append((time.perf_counter() - t0) * 1e3)
        stats = bs.stats()
        if r.files.output:
            from edgesplit.runtime.harness import save_arrays

            save_arrays(out, r.files.output)
    return BandRun(stats, float(np.median(lat)), float(np.percentile(lat, 90)), r.repeat)


@dataclass(frozen=True)
class GenerateRequest:
    """How tokens are generated from a decoder bundle (``edgesplit run --generate``).

    Attributes:
        prompt_ids: The prompt's token ids; None: ``prompt_tokens`` seeded random ids.
        prompt_tokens: Length of the random prompt.
        new_tokens: Tokens to generate.
        chunk_tokens: Static prefill chunk (0: the whole prompt in one run).
        seed: Seed of the random prompt.
        trust_key: Load the bundle only if signed by this ed25519 public key.
        server: ``remote`` executor options (``url``, ``token``, ``model_prefix``) of a server
            serving the same decoder that prefills the prompt instead (None: the bundle's part
            does); decode runs here.
    """

    prompt_ids: Sequence[int] | None = None
    prompt_tokens: int = 32
    new_tokens: int = 32
    chunk_tokens: int = 32
    seed: int = 0
    trust_key: str | os.PathLike | None = None
    server: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class GenerateRun:
    """A generation's tokens, its figures (:class:`edgesplit.generate.GenerateStats`), the
    bundle's per-part timings of its run calls (``SessionStats``) and the server that prefilled
    (None: the bundle's part)."""

    tokens: list[int]
    stats: Any
    parts: Any
    prefill_server: str | None = None


def generate_bundle(bundle: str | os.PathLike, request: GenerateRequest) -> GenerateRun:
    """Generate ``request.new_tokens`` greedy tokens from a decoder bundle, after one untimed
    warm-up generation of the same prompt (two tokens at most).

    Raises:
        InputError: a bundle that cannot generate, or a bad request (one line).
        RemoteHostError: ``request.server`` could not prefill the prompt (one line, exit code 2).
    """
    import numpy as np

    from edgesplit.runtime.harness import load

    r = request
    with load(bundle, trust_key=r.trust_key) as sess:
        gen = sess.generator(r.chunk_tokens)
        if r.prompt_ids is not None:
            prompt = list(r.prompt_ids)
        else:
            rng = np.random.default_rng(r.seed)
            prompt = [int(t) for t in rng.integers(0, gen.config.vocab_size, r.prompt_tokens)]
        gen.check_request(prompt, r.new_tokens)
        with _server_prefill(r.server, sess.manifest.parts[0].name, gen) as prefill:
            list(sess.generate_with(gen, prompt, min(r.new_tokens, 2), prefill=prefill))
            sess.reset_stats()
            tokens = list(sess.generate_with(gen, prompt, r.new_tokens, prefill=prefill))
        where = r.server["url"] if r.server else None
        return GenerateRun(tokens, sess.last_generate_stats, sess.stats(), where)


@contextlib.contextmanager
def _server_prefill(server: Mapping[str, Any] | None, part: str, gen: Any) -> Iterator[Any]:
    """A server's prefill of the bundle's decoder part (None without a server; see
    :func:`edgesplit.generate.offload.served_prefill`)."""
    if server is None:
        yield None
        return
    from edgesplit.generate.offload import served_prefill
    from edgesplit.runtime.oip import served_name

    model = served_name(part, server.get("model_prefix", ""))
    timeout_s = server.get("timeout_s", 600.0)
    with served_prefill(server["url"], model, gen.config, server.get("token"), timeout_s) as p:
        yield p
