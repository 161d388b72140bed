"""Level the processors' whole-model times against one another, measured in alternating rounds.

A profiler times each pair's whole model in one block, one pair after the other. On a machine whose
speed drifts (a VM's neighbours, a phone heating up), a block that falls in a slow phase makes its
processor look slower than the others, and the optimiser then trusts an asymmetry that is not
there. Measured here: a resnet18 profile on ``host-2core`` gave core0 61.4 ms and core1 51.1 ms in
their blocks; alternating rounds a minute later measured 48.1 and 47.9 ms.

:func:`level` times the whole model again on one pair per processor (the first whose profiler can
time it alone: ``whole_model_timer``), in :data:`ROUNDS` rounds in rotated order, a few runs each,
so that every processor samples the same phases of the machine. Each leveled pair's
``whole_model_ms`` (which scales its node times in the cost model) and ``whole_model_p90_ms``
become the medians of those rounds; its note keeps the block's figure. A processor's other pairs
(sharing its cores, where an idle runtime's spinning threads would slow the next one down) and
pairs whose profiler has no timer keep their block figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import ExitStack

import numpy as np

from edgesplit.device.spec import DeviceSpec
from edgesplit.model.graph import ModelGraph
from edgesplit.profile.store import MEASURED, ProcessorProfile
from edgesplit.util import Progress

ROUNDS = 5


def _levelable(
    entries: Sequence[ProcessorProfile], device: DeviceSpec
) -> list[tuple[int, Callable]]:
    """(entry index, the timer factory) of the first timeable measured pair of each processor."""
    from edgesplit.profile.backends import PROFILERS

    out, seen = [], set()
    local = {p.name for p in device.processors if not p.is_remote}
    for i, e in enumerate(entries):
        make = getattr(PROFILERS.get(e.backend), "whole_model_timer", None)
        if e.processor in seen or e.processor not in local or make is None:
            continue
        if e.source == MEASURED and e.whole_model_ms and not e.unsupported:
            out.append((i, make))
            seen.add(e.processor)
    return out


def level(
    graph: ModelGraph,
    device: DeviceSpec,
    entries: Sequence[ProcessorProfile],
    runs: int,
    progress: Progress | None = None,
) -> tuple[ProcessorProfile, ...]:
    """``entries`` with the whole-model times of one pair per processor measured again in
    alternating rounds (``runs`` timed runs per pair in all); unchanged with fewer than two such
    pairs. See the module doc."""
    todo = _levelable(entries, device)
    if len(todo) < 2:
        return tuple(entries)
    per_round = max(2, -(-runs // ROUNDS))
    samples: dict[int, list[float]] = {i: [] for i, _ in todo}
    total, done = ROUNDS * len(todo), 0
    with ExitStack() as stack:
        timers = {}
        for i, make in todo:
            proc = device.processor(entries[i].processor)
            timers[i] = stack.enter_context(make(graph, proc, proc.backend(entries[i].backend)))
        order = list(timers)
        for r in range(ROUNDS):
            for i in order[r % len(order) :] + order[: r % len(order)]:
                timers[i]()  # untimed: the first run after another processor's
                samples[i] += [timers[i]() for _ in range(per_round)]
                done += 1
                if progress is not None:
                    progress("level", done, total)
    out = list(entries)
    for i, xs in samples.items():
        e = out[i]
        med, p90 = float(np.median(xs)), float(np.percentile(xs, 90))
        how = (
            f"whole model {e.whole_model_ms:.3f} ms in its block, {med:.3f} ms leveled "
            f"({len(xs)} runs)"
        )
        note = "; ".join(x for x in (e.note, how) if x)
        out[i] = dataclasses.replace(
            e, whole_model_ms=round(med, 6), whole_model_p90_ms=round(p90, 6), note=note
        )
    return tuple(out)
