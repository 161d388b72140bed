"""Prefill on a server, decode on the device: the prompt goes up, the KV cache comes down.

The server is ``edgesplit serve`` on a bundle whose part is the whole decoder with dynamic lengths
(served for any length, :mod:`edgesplit.runtime.served_decoder`). :class:`RemotePrefill` sends the
prompt's ids (with its mask, its positions and an empty past) in one OIP request and asks for the
``present`` cache and the last position's logits only; the arrays that come back are bound as
ONNX Runtime values, as they are, into a :class:`~edgesplit.generate.kv.KVCache` of exactly the
prompt's positions, and :class:`~edgesplit.generate.Generator` decodes from it locally::

    gen = Generator(model)
    prefill = RemotePrefill(OipClient(url), "p0", gen.config)
    tokens = list(gen.generate(prompt, 64, prefill=prefill))

:func:`measure_server_prefill` gives the figures the phase planner prices this with
(:class:`~edgesplit.generate.phases.ServerPrefill`): the server's own time per prefill request,
and the bytes each way beyond the cache.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from edgesplit.errors import RemoteError, RemoteHostError
from edgesplit.generate.kv import KVCache
from edgesplit.generate.phases import ServerPrefill
from edgesplit.generate.reference import cache_names
from edgesplit.model.zoo_decoder import DecoderConfig
from edgesplit.runtime.client import Exchange, OipClient
from edgesplit.runtime.served_decoder import LAST_LOGITS

__all__ = ["RemotePrefill", "ServerFigures", "measure_server_prefill", "prefill_feeds"]


def prefill_feeds(config: DecoderConfig, prompt: Sequence[int]) -> dict[str, np.ndarray]:
    """The inputs of one prefill of ``prompt`` in one run: ids, a mask of ones, positions from 0,
    and an empty past."""
    n = len(prompt)
    feeds = {
        "input_ids": np.asarray([prompt], dtype=np.int64),
        "attention_mask": np.ones((1, n), np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
    }
    shape = (1, config.kv_heads, 0, config.head_dim)
    for past, _ in cache_names(config):
        feeds[past] = np.zeros(shape, np.float32)
    return feeds


class RemotePrefill:
    """A prefill on an OIP server, as a :data:`~edgesplit.generate.generator.Prefill` callable.

    Args:
        client: The server's client.
        model: The decoder's model name there (its part's name).
        config: The decoder's sizes.
        timeout_s: For the request.

    Attributes:
        last_exchange: What the last call cost on the wire (None before the first).
    """

    def __init__(
        self, client: OipClient, model: str, config: DecoderConfig, timeout_s: float = 120.0
    ):
        self.client, self.model, self.config, self.timeout_s = client, model, config, timeout_s
        self.names = cache_names(config)
        self.last_exchange: Exchange | None = None

    def __call__(self, prompt: list[int]) -> tuple[KVCache, np.ndarray]:
        """The cache of ``prompt`` as the server computed it, and its last token's logits.

        Raises:
            RemoteError: the server refused or did not answer (its one-line reason).
        """
        wanted = [LAST_LOGITS, *(present for _, present in self.names)]
        out, self.last_exchange = self.client.infer(
            self.model, prefill_feeds(self.config, prompt), wanted, timeout_s=self.timeout_s
        )
        # the answer's arrays are views of its body: bound as they are (ORT keeps them alive)
        values = {
            past: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(out[present]))
            for past, present in self.names
        }
        return KVCache(self.names, values, [1] * len(prompt)), out[LAST_LOGITS][0]


@dataclass(frozen=True)
class ServerFigures:
    """A server's prefill of one prompt length, measured from the device.

    Attributes:
        prompt_tokens: P.
        server_ms: The server's own time per request (``Server-Timing`` total), the median.
        compute_ms: Of it, the run (``Server-Timing`` compute), the median.
        elapsed_ms: Each request as the device saw it, the median (on the link it was measured on).
        upload_nbytes: The request on the wire.
        download_fixed_nbytes: The answer on the wire beyond the cache.
        cache_nbytes: The cache of P positions.
    """

    prompt_tokens: int
    server_ms: float
    compute_ms: float
    elapsed_ms: float
    upload_nbytes: int
    download_fixed_nbytes: int
    cache_nbytes: int

    def pricing(self, server: str, link: tuple[float, float, float]) -> ServerPrefill:
        """The planner's figures with ``link`` = (up Mbit/s, down Mbit/s, RTT ms)."""
        up, down, rtt = link
        return ServerPrefill(
            server, self.server_ms, self.upload_nbytes, self.download_fixed_nbytes, up, down, rtt
        )


def measure_server_prefill(
    prefill: RemotePrefill, prompt: Sequence[int], repeats: int = 5
) -> ServerFigures:
    """Prefill ``prompt`` on the server ``repeats`` times after one untimed request."""
    prompt = [int(t) for t in prompt]
    prefill(prompt)
    runs: list[Exchange] = []
    cache_nbytes = 0
    for _ in range(max(repeats, 1)):
        cache, _ = prefill(prompt)
        assert prefill.last_exchange is not None
        runs.append(prefill.last_exchange)
        cache_nbytes = cache.nbytes
    last = runs[-1]
    return ServerFigures(
        len(prompt),
        statistics.median(e.server_ms for e in runs),
        statistics.median(e.compute_ms for e in runs),
        statistics.median(e.elapsed_ms for e in runs),
        last.sent_nbytes,
        last.received_nbytes - cache_nbytes,
        cache_nbytes,
    )


@contextlib.contextmanager
def served_prefill(
    url: str,
    model: str,
    config: DecoderConfig,
    token: str | None = None,
    timeout_s: float = 600.0,
) -> Iterator[RemotePrefill]:
    """A :class:`RemotePrefill` of ``model`` on the server at ``url`` that the user named, its
    client closed after. A server that fails a prefill in the block is bad input: the failure is
    raised as :class:`~edgesplit.errors.RemoteHostError` (one line, exit code 2)."""
    client = OipClient(url, token=token, timeout_s=timeout_s)
    try:
        yield RemotePrefill(client, model, config, timeout_s=timeout_s)
    except RemoteError as e:
        if isinstance(e, RemoteHostError):
            raise
        raise RemoteHostError(f"server {url} could not prefill with '{model}': {e}") from e
    finally:
        client.close()
