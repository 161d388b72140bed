"""A plan per phase: which processor prefills (in chunks of how many tokens) and which decodes.

A decoder's two phases want different things: prefill of the prompt is compute-bound, decode reads
every weight and the whole cache per token. :class:`PhaseProfile` holds what each processor of a
device measured for the whole decoder (:mod:`edgesplit.generate.phase_measure`): the ms of one
prefill chunk at each chunk size, and the ms of one decode step at a few cache lengths. The
pricing here is a pure function of that profile:

- time to first token: ``ceil(P / chunk) * chunk_ms`` on the prefill processor;
- decode: the ``N - 1`` steps after the first token (which prefill gives), step ``i`` priced at
  cache length ``slots + i`` (``slots``: the prompt rounded up to whole chunks, padded slots stay
  in the cache) by linear interpolation between the measured cache lengths;
- a switch: when the decode processor is another one, the cache at the end of prefill is moved
  through host memory, ``cache bytes / host copy bandwidth``;
- energy: each phase's ms at its processor's active power (the switch at the decode processor's).

With a :class:`ServerPrefill` in the profile, prefill on the server is a candidate too: the prompt
goes up (the request's bytes at the link's uplink rate), the server prefills the whole prompt in
one run (its own measured time), and the cache of P positions and the last logits come down (at
the downlink rate), plus one RTT; then the device decodes from a cache of exactly P positions.
Time to first token holds all of it. Energy: the radio's power over each transfer (the wait for
the server is not charged), then decode as above.

:func:`choose_phases` returns every (prefill processor, chunk, decode processor) candidate priced,
and the one with the least total (time to first token + switch + decode);
:func:`choose_per_band` chooses once per link bandwidth.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgesplit.errors import InputError

PHASE_PLAN_FORMAT = "edgesplit-phase-plan/1"


@dataclass(frozen=True)
class ProcessorPhases:
    """What one processor measured for the whole decoder.

    Attributes:
        processor: The processor's name in the device spec.
        active_w: Its active power (the spec's figure).
        prefill_chunk_ms: Chunk tokens -> ms of one prefill chunk (the mean chunk of a prefill of
            the prompt at that chunk size).
        decode_step_ms: (cache tokens, ms of one decode step at that cache length), by length.
    """

    processor: str
    active_w: float
    prefill_chunk_ms: Mapping[int, float]
    decode_step_ms: tuple[tuple[float, float], ...]

    def decode_ms_at(self, cache_tokens: float) -> float:
        """One decode step at ``cache_tokens``: linear between the measured lengths, the nearest
        measured figure beyond them (a noisy slope is not extrapolated)."""
        pts = sorted(self.decode_step_ms)
        if cache_tokens <= pts[0][0]:
            return pts[0][1]
        if cache_tokens >= pts[-1][0]:
            return pts[-1][1]
        i = 0
        while i < len(pts) - 2 and cache_tokens > pts[i + 1][0]:
            i += 1
        (x0, y0), (x1, y1) = pts[i], pts[i + 1]
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        return y0 + slope * (cache_tokens - x0)


@dataclass(frozen=True)
class ServerPrefill:
    """A server that prefills the whole prompt in one run and sends the cache back, and the link.

    Attributes:
        server: Its name (the candidates' prefill processor).
        prefill_ms: The server's own time for one prefill request of the P-token prompt (measured
            there: decoding the request, the run, encoding the answer).
        upload_nbytes: The request on the wire (ids, mask, positions, empty past, headers).
        download_fixed_nbytes: The answer on the wire beyond the cache (last logits, headers).
        up_mbps: Uplink rate.
        down_mbps: Downlink rate.
        rtt_ms: Round-trip time.
        tx_power_w: The device's radio power while sending.
        rx_power_w: The device's radio power while receiving.
    """

    server: str
    prefill_ms: float
    upload_nbytes: int
    download_fixed_nbytes: int
    up_mbps: float
    down_mbps: float
    rtt_ms: float
    tx_power_w: float = 0.0
    rx_power_w: float = 0.0

    def to_json(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(self).items()}


@dataclass(frozen=True)
class PhaseProfile:
    """Per-phase costs of a decoder on a device's processors.

    Attributes:
        model_name: The decoder.
        device: The device spec's name.
        prompt_tokens: P, the prompt the prefill figures were measured at.
        new_tokens: N, the tokens to generate.
        cache_nbytes_per_token: Bytes the whole KV cache holds per position (every layer).
        host_copy_gbps: Measured host memory copy bandwidth (GB/s), for moving the cache.
        processors: Each processor's figures.
        server: A server that can prefill instead, and the link to it (None: local only).
    """

    model_name: str
    device: str
    prompt_tokens: int
    new_tokens: int
    cache_nbytes_per_token: int
    host_copy_gbps: float
    processors: tuple[ProcessorPhases, ...]
    server: ServerPrefill | None = None

    def of(self, name: str) -> ProcessorPhases:
        for p in self.processors:
            if p.processor == name:
                return p
        raise InputError(f"no processor {name!r} in the phase profile")


@dataclass(frozen=True)
class PhaseCandidate:
    """One priced (prefill processor, chunk, decode processor) choice.

    Attributes:
        prefill_processor: Runs the prompt.
        chunk_tokens: Prefill chunk.
        decode_processor: Runs the steps after the first token.
        ttft_ms: Predicted time to first token.
        switch_nbytes: Cache bytes moved between the phases (0 on one processor).
        switch_ms: Predicted ms of that move.
        decode_ms: Predicted ms of the ``N - 1`` decode steps.
        energy_mj: Predicted energy of the whole generation.
        new_tokens: N.
        transfer_ms: Of the time to first token, the link's share (prefill on a server: upload,
            RTT, download of the cache; 0 otherwise).
        offloaded: Whether the server prefills (``chunk_tokens`` 0: the whole prompt in one run).
    """

    prefill_processor: str
    chunk_tokens: int
    decode_processor: str
    ttft_ms: float
    switch_nbytes: int
    switch_ms: float
    decode_ms: float
    energy_mj: float
    new_tokens: int
    transfer_ms: float = 0.0
    offloaded: bool = False

    @property
    def total_ms(self) -> float:
        return self.ttft_ms + self.switch_ms + self.decode_ms

    @property
    def decode_tokens_per_s(self) -> float:
        steps = self.new_tokens - 1
        return steps / (self.decode_ms / 1e3) if steps > 0 and self.decode_ms > 0 else 0.0

    @property
    def energy_per_token_mj(self) -> float:
        return self.energy_mj / self.new_tokens if self.new_tokens else 0.0

    @property
    def single_processor(self) -> bool:
        return self.prefill_processor == self.decode_processor

    @property
    def label(self) -> str:
        if self.offloaded:
            return f"prefill on server {self.prefill_processor} -> decode {self.decode_processor}"
        if self.single_processor:
            return f"{self.prefill_processor} (chunk {self.chunk_tokens})"
        return (
            f"prefill {self.prefill_processor} (chunk {self.chunk_tokens}) "
            f"-> decode {self.decode_processor}"
        )

    def to_json(self) -> dict:
        return {
            "prefill_processor": self.prefill_processor,
            "chunk_tokens": self.chunk_tokens,
            "decode_processor": self.decode_processor,
            "ttft_ms": round(self.ttft_ms, 4),
            "switch_nbytes": self.switch_nbytes,
            "switch_ms": round(self.switch_ms, 4),
            "decode_ms": round(self.decode_ms, 4),
            "total_ms": round(self.total_ms, 4),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "energy_mj": round(self.energy_mj, 4),
            "energy_per_token_mj": round(self.energy_per_token_mj, 4),
            "offloaded": self.offloaded,
            "transfer_ms": round(self.transfer_ms, 4),
        }


@dataclass(frozen=True)
class PhasePlan:
    """The chosen candidate, every candidate by total (least first), and the profile."""

    chosen: PhaseCandidate
    candidates: tuple[PhaseCandidate, ...]
    profile: PhaseProfile

    def best_single(self) -> PhaseCandidate:
        """The best candidate that runs both phases on one processor."""
        return next(c for c in self.candidates if c.single_processor)

    def to_json(self) -> dict:
        pr = self.profile
        return {
            "format": PHASE_PLAN_FORMAT,
            "model_name": pr.model_name,
            "device": pr.device,
            "prompt_tokens": pr.prompt_tokens,
            "new_tokens": pr.new_tokens,
            "objective": "ttft_plus_decode_ms",
            "chosen": self.chosen.to_json(),
            "candidates": [c.to_json() for c in self.candidates],
            "profile": {
                "cache_nbytes_per_token": pr.cache_nbytes_per_token,
                "host_copy_gbps": round(pr.host_copy_gbps, 3),
                "processors": [
                    {
                        "processor": p.processor,
                        "active_w": p.active_w,
                        "prefill_chunk_ms": {
                            str(k): round(v, 4) for k, v in sorted(p.prefill_chunk_ms.items())
                        },
                        "decode_step_ms": [
                            {"cache_tokens": x, "ms": round(y, 4)} for x, y in p.decode_step_ms
                        ],
                    }
                    for p in pr.processors
                ],
                "server": pr.server.to_json() if pr.server else None,
            },
        }


def prompt_slots(prompt_tokens: int, chunk_tokens: int) -> int:
    """Cache positions after a chunked prefill: the prompt rounded up to whole chunks."""
    return math.ceil(prompt_tokens / chunk_tokens) * chunk_tokens


def price(
    profile: PhaseProfile, prefill_processor: str, chunk_tokens: int, decode_processor: str
) -> PhaseCandidate:
    """The predicted figures of one choice (see the module's docstring for the formulas)."""
    pre, dec = profile.of(prefill_processor), profile.of(decode_processor)
    if chunk_tokens not in pre.prefill_chunk_ms:
        raise InputError(f"{prefill_processor} has no prefill figure at chunk {chunk_tokens}")
    p, n = profile.prompt_tokens, profile.new_tokens
    ttft_ms = math.ceil(p / chunk_tokens) * pre.prefill_chunk_ms[chunk_tokens]
    slots = prompt_slots(p, chunk_tokens)
    decode_ms = _decode_ms(dec, slots, n)
    moved = 0 if pre.processor == dec.processor else slots * profile.cache_nbytes_per_token
    switch_ms = moved / (profile.host_copy_gbps * 1e9) * 1e3 if moved else 0.0
    energy_mj = ttft_ms * pre.active_w + (switch_ms + decode_ms) * dec.active_w
    return PhaseCandidate(
        pre.processor, chunk_tokens, dec.processor, ttft_ms, moved, switch_ms, decode_ms,
        energy_mj, n,
    )  # fmt: skip


def _decode_ms(dec: ProcessorPhases, slots: int, new_tokens: int) -> float:
    """The ``new_tokens - 1`` steps after the first token, from a cache of ``slots``."""
    return sum(dec.decode_ms_at(slots + i) for i in range(max(new_tokens - 1, 0)))


def price_offloaded(profile: PhaseProfile, decode_processor: str) -> PhaseCandidate:
    """Prefill on the profile's server, decode on ``decode_processor`` (see the module's
    docstring).

    Raises:
        InputError: a profile without a server, or a link without a rate.
    """
    srv = profile.server
    if srv is None:
        raise InputError(f"{profile.model_name}: no server in the phase profile")
    if srv.up_mbps <= 0 or srv.down_mbps <= 0:
        raise InputError(f"{srv.server}: the link's rates must be positive")
    dec, p, n = profile.of(decode_processor), profile.prompt_tokens, profile.new_tokens
    cache = p * profile.cache_nbytes_per_token
    up_ms = srv.upload_nbytes * 8 / (srv.up_mbps * 1e3)
    down_ms = (srv.download_fixed_nbytes + cache) * 8 / (srv.down_mbps * 1e3)
    transfer_ms = srv.rtt_ms + up_ms + down_ms
    ttft_ms = srv.prefill_ms + transfer_ms
    decode_ms = _decode_ms(dec, p, n)
    energy_mj = up_ms * srv.tx_power_w + down_ms * srv.rx_power_w + decode_ms * dec.active_w
    return PhaseCandidate(
        srv.server, 0, dec.processor, ttft_ms, cache, 0.0, decode_ms, energy_mj, n, transfer_ms,
        offloaded=True,
    )  # fmt: skip


def all_candidates(profile: PhaseProfile) -> list[PhaseCandidate]:
    """Every (prefill processor, chunk, decode processor) of the profile, and every decode
    processor after a server's prefill, priced, least total first (ties: local before the server,
    fewer switches, then by name)."""
    out = [
        price(profile, pre.processor, chunk, dec.processor)
        for pre, dec in itertools.product(profile.processors, repeat=2)
        for chunk in sorted(pre.prefill_chunk_ms)
    ]
    if profile.server is not None:
        out += [price_offloaded(profile, dec.processor) for dec in profile.processors]
    return sorted(out, key=lambda c: (c.total_ms, c.offloaded, not c.single_processor, c.label))


def choose_phases(profile: PhaseProfile) -> PhasePlan:
    """The candidate with the least time to first token + switch + decode, and all of them.

    Raises:
        InputError: a profile with no processor or no prefill figure.
    """
    cands = all_candidates(profile)
    if not cands:
        raise InputError(f"{profile.model_name}: no processor has prefill figures to plan with")
    return PhasePlan(cands[0], tuple(cands), profile)


def at_bandwidth(profile: PhaseProfile, mbps: float) -> PhaseProfile:
    """``profile`` with its server's link at ``mbps`` both ways.

    Raises:
        InputError: a profile without a server.
    """
    if profile.server is None:
        raise InputError(f"{profile.model_name}: no server in the phase profile")
    link = dataclasses.replace(profile.server, up_mbps=mbps, down_mbps=mbps)
    return dataclasses.replace(profile, server=link)


def choose_per_band(profile: PhaseProfile, bands_mbps: Sequence[float]) -> list[PhasePlan]:
    """:func:`choose_phases` at each link rate of ``bands_mbps`` (both ways), in order."""
    return [choose_phases(at_bandwidth(profile, mbps)) for mbps in bands_mbps]


def chunk_sizes(prompt_tokens: int, candidates: Sequence[int] = (16, 32, 64)) -> tuple[int, ...]:
    """The candidate chunk sizes that fit the prompt (the prompt itself when none does)."""
    fit = tuple(c for c in candidates if c <= prompt_tokens)
    return fit or (prompt_tokens,)


def decode_lengths(prompt_tokens: int, new_tokens: int, chunks: Sequence[int]) -> tuple[int, ...]:
    """Cache lengths the decode step is measured at: P, P + N/2 and the longest cache a plan
    reaches (the prompt padded to the largest chunk, plus N), distinct."""
    last = prompt_slots(prompt_tokens, max(chunks)) + new_tokens
    return tuple(sorted({prompt_tokens, prompt_tokens + new_tokens // 2, last}))
