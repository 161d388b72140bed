"""``partition --generate``: measure a decoder's phases on a device, choose a plan per phase, and
write it (see :mod:`edgesplit.generate.phases`).

With a :class:`PrefillServer` (a running ``edgesplit serve`` of the decoder), prefill on that server
is a candidate too: its prefill of a P-token prompt is measured from this machine (the server's own
time from its ``Server-Timing``, the request's and the answer's bytes), and priced on the link the
user names.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from edgesplit.device.spec import NetworkLink, network_link
from edgesplit.errors import InputError
from edgesplit.generate.phase_measure import MeasureOptions, measure_phases, random_prompt
from edgesplit.generate.phases import PhasePlan, ServerPrefill, choose_phases
from edgesplit.util import write_json
from edgesplit.workflows.resolve import SpecLike, load_spec


@dataclass(frozen=True)
class PrefillServer:
    """A running ``edgesplit serve`` of the decoder (a one-part bundle) that may prefill prompts.

    Attributes:
        url: The server's address.
        model: The decoder's name there (the bundle's part, ``p0`` for a one-part bundle).
        token: Its bearer token.
        link: The link to price the prompt's upload and the cache's download on (None: the
            ``wifi`` preset).
        name: What plans call it.
        repeats: Prefill requests timed (after one untimed).
    """

    url: str
    model: str = "p0"
    token: str | None = None
    link: NetworkLink | None = None
    name: str = "server"
    repeats: int = 5


@dataclass(frozen=True)
class PhaseRequest:
    """The generation to plan for, and how much to measure.

    Attributes:
        prompt_tokens: P, the prompt.
        new_tokens: N, the tokens to generate.
        measure: Chunk sizes, repeats, processors (see :class:`MeasureOptions`).
        server: A server that may prefill instead (None: the device's processors only).
    """

    prompt_tokens: int
    new_tokens: int
    measure: MeasureOptions = MeasureOptions()
    server: PrefillServer | None = None


@dataclass(frozen=True)
class WrittenPhasePlan:
    """The chosen phase plan and where it was written."""

    plan: PhasePlan
    path: str


def load_decoder(model: str | os.PathLike) -> onnx.ModelProto:
    """The ONNX file ``model``, once it is a decoder in the layout generation takes.

    Raises:
        InputError: not an ONNX file, or not a decoder (one line naming the file).
    """
    from edgesplit.compile.dynamic import is_decoder

    try:
        proto = onnx.load(os.fspath(model))
    except Exception as e:  # noqa: BLE001 - onnx raises plain exceptions of many kinds
        raise InputError(f"{model}: not an ONNX model ({type(e).__name__}: {e})") from e
    if not is_decoder({i.name for i in proto.graph.input}):
        raise InputError(
            f"{model}: not a decoder: partition --generate needs input_ids and "
            "past_key_values.N.key/value inputs"
        )
    return proto


def write_phase_plan(
    model: str | os.PathLike,
    device: SpecLike,
    request: PhaseRequest,
    output: str | os.PathLike,
    on_note: Callable[[str], None] | None = None,
) -> WrittenPhasePlan:
    """Measure ``model`` per phase on ``device``'s local processors (and its prefill on
    ``request.server``), choose the plan with the least time to first token + decode of
    ``request``, and write it as JSON (atomically).

    Raises:
        InputError: not a decoder, a bad request, or no processor to measure.
        RemoteHostError: the server could not prefill the prompt: unreachable, refusing it, or
            failing (one line with its reason; exit code 2).
    """
    proto = load_decoder(model)
    spec = load_spec(device)
    workload = (request.prompt_tokens, request.new_tokens)
    server = (  # first: a server that cannot be used fails before minutes of measuring here
        server_prefill(proto, request.prompt_tokens, request.server) if request.server else None
    )
    profile = measure_phases(proto, spec, workload, request.measure, on_note)
    if server is not None:
        profile = dataclasses.replace(profile, server=server)
    plan = choose_phases(profile)
    write_json(output, plan.to_json(), "phase plan")
    return WrittenPhasePlan(plan, os.fspath(output))


def server_prefill(
    proto: onnx.ModelProto, prompt_tokens: int, server: PrefillServer
) -> ServerPrefill:
    """The server's prefill of a ``prompt_tokens`` prompt, measured from here and priced on
    ``server.link``.

    Raises:
        RemoteHostError: the server could not prefill it (one line).
    """
    from edgesplit.generate.offload import measure_server_prefill, served_prefill
    from edgesplit.model.zoo_decoder import config_of

    config = config_of(proto)
    link = server.link or network_link(None)
    prompt = random_prompt(config.vocab_size, prompt_tokens, seed=7)
    with served_prefill(server.url, server.model, config, server.token) as remote:
        figures = measure_server_prefill(remote, prompt, repeats=server.repeats)
    priced = figures.pricing(server.name, (link.up_mbps, link.down_mbps, link.rtt_ms))
    return dataclasses.replace(priced, tx_power_w=link.tx_power_w, rx_power_w=link.rx_power_w)
