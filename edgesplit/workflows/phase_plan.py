"""``partition --generate``: measure a decoder's phases on a device, choose a plan per phase, and
write it (see :mod:`edgesplit.generate.phases`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from edgesplit.errors import InputError
from edgesplit.generate.phase_measure import MeasureOptions, measure_phases
from edgesplit.generate.phases import PhasePlan, choose_phases
from edgesplit.util import write_json
from edgesplit.workflows.resolve import SpecLike, load_spec


@dataclass(frozen=True)
class PhaseRequest:
    """The generation to plan for, and how much to measure.

    Attributes:
        prompt_tokens: P, the prompt.
        new_tokens: N, the tokens to generate.
        measure: Chunk sizes, repeats, processors (see :class:`MeasureOptions`).
    """

    prompt_tokens: int
    new_tokens: int
    measure: MeasureOptions = MeasureOptions()


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
    """Measure ``model`` per phase on ``device``'s local processors, choose the plan with the
    least time to first token + decode of ``request``, and write it as JSON (atomically).

    Raises:
        InputError: not a decoder, a bad request, or no processor to measure.
    """
    proto = load_decoder(model)
    spec = load_spec(device)
    workload = (request.prompt_tokens, request.new_tokens)
    profile = measure_phases(proto, spec, workload, request.measure, on_note)
    plan = choose_phases(profile)
    write_json(output, plan.to_json(), "phase plan")
    return WrittenPhasePlan(plan, os.fspath(output))
