"""Profile one (processor, backend) pair at a time: checkpoints, resume, measured energy.

:func:`profile_steps` runs the same profiler as :func:`edgesplit.profile.run.profile_model`, one
pair per call, so that
- each finished pair can be handed to ``on_entry`` (the remote agent sends it back to the client,
  which saves a partial profile: ``--resume`` then skips it);
- the power rails, where the device has them, are averaged over the window in which that pair's
  timed runs happened, and each measured node gets ``energy_mj = mean power x latency``. The rails
  measure the whole rail (a package, a board input, a battery), idle power included.

Where no rail exists the profile says ``energy: modelled`` and node energies are the profiler's
own (active power from the spec x latency).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from edgesplit.device.detect import emulation
from edgesplit.device.spec import Backend, DeviceSpec, Processor
from edgesplit.model.graph import ModelGraph
from edgesplit.profile.level import level
from edgesplit.profile.power import PowerSampler, Rails, find_rails
from edgesplit.profile.run import (
    ProfileOptions,
    empty_profile,
    profile_pair,
    profiling_stage,
    selected,
)
from edgesplit.profile.store import MEASURED, MODELLED, ProcessorProfile, Profile, load_profile
from edgesplit.util import Progress, atomic_write_text

OnEntry = Callable[[ProcessorProfile], None]


def pairs(device: DeviceSpec, options: ProfileOptions) -> list[str]:
    """The ``processor/backend`` keys a profile of ``device`` has, in profile order."""
    return [f"{p.name}/{b.key}" for p, b in selected(device, options)]


def with_energy(entry: ProcessorProfile, power_w: float, how: str) -> ProcessorProfile:
    """``entry`` with each measured node's energy = ``power_w`` x its latency (W x ms = mJ)."""
    nodes = {
        name: dataclasses.replace(c, energy_mj=round(power_w * c.latency_ms, 6))
        if c.source == MEASURED
        else c
        for name, c in entry.nodes.items()
    }
    note = "; ".join(x for x in (entry.note, how) if x)
    return dataclasses.replace(entry, nodes=nodes, note=note, energy=MEASURED)


def profile_steps(
    graph: ModelGraph,
    device: DeviceSpec,
    options: ProfileOptions | None = None,
    *,
    progress: Progress | None = None,
    done: Sequence[ProcessorProfile] = (),
    on_entry: OnEntry | None = None,
    rails: Rails | None = None,
    sysfs_root: str = "/",
) -> Profile:
    """Profile ``graph`` on ``device`` pair by pair; see the module docstring.

    Args:
        options: Which pairs and how many runs (as for :func:`profile_model`).
        done: Entries measured earlier (a resumed run); their pairs are not measured again.
        on_entry: Called with each newly finished entry, in order (before the processors'
            whole-model times are leveled, :func:`~edgesplit.profile.level.level`).
        rails: The power rails to sample (default: those found under ``sysfs_root``).
    """
    opts = options or ProfileOptions()
    rails = find_rails(sysfs_root) if rails is None else rails
    kept = {e.key: e for e in done}
    entries: list[ProcessorProfile] = []
    with profiling_stage(graph) as doing:  # the time limit; failed runs name the made-up inputs
        for proc, backend in selected(device, opts):
            key = f"{proc.name}/{backend.key}"
            if key in kept:
                entries.append(kept[key])
                continue
            doing[0] = f"profiling on {proc.name} ({backend.key})"
            entry = _measure_pair(graph, device, proc, backend, opts, rails, progress)
            entries.append(entry)
            if on_entry is not None:
                on_entry(entry)
        doing[0] = "profiling the whole model"
        leveled = level(graph, device, entries, opts.runs, progress)
    measured = any(e.energy == MEASURED for e in entries)
    return dataclasses.replace(
        empty_profile(graph, device),
        entries=leveled,
        energy=MEASURED if measured else MODELLED,
        emulated=emulation(),
    )


def _measure_pair(
    graph: ModelGraph,
    device: DeviceSpec,
    proc: Processor,
    backend: Backend,
    options: ProfileOptions,
    rails: Rails,
    progress: Progress | None,
) -> ProcessorProfile:
    """One pair, with the rails' mean power over its timed runs turned into node energies."""
    window: dict[str, float] = {}
    with PowerSampler(rails) as sampler:

        def tick(label: str, n: int, total: int) -> None:
            if rails and ("t0" not in window or n == total):
                window.setdefault("t0", sampler.mark())
                if n == total:
                    window["t1"] = sampler.mark()
            if progress is not None:
                progress(label, n, total)

        start = sampler.mark()
        entry = profile_pair(graph, device, proc, backend, options, tick)
        end = sampler.mark()
    if not (rails and entry.source == MEASURED and entry.nodes):
        return entry
    t0, t1 = window.get("t0", start), window.get("t1", end)
    if t1 - t0 < 0.05:
        t0, t1 = start, end
    power_w = sampler.mean_power_w(t0, t1)
    if power_w is None:
        return entry
    return with_energy(
        entry, power_w, f"energy measured: {rails.source} mean {power_w:.2f} W over {t1 - t0:.1f} s"
    )


def partial_path(output: str | os.PathLike) -> Path:
    """Where the checkpoints of a profile headed for ``output`` are kept: ``OUTPUT.partial``."""
    return Path(f"{output}.partial")


def save_partial(
    part: Path,
    sha256: str,
    model_name: str,
    device: str,
    input_shapes: Mapping[str, Sequence[int]] | None,
    entries: Iterable[ProcessorProfile],
    host: str = "",
) -> None:
    """Write the pairs finished so far as a profile (atomically), for ``--resume``."""
    prof = Profile(
        model_sha256=sha256,
        model_name=model_name,
        device=device,
        input_shapes={k: tuple(v) for k, v in (input_shapes or {}).items()},
        entries=tuple(entries),
        host=host,
    )
    atomic_write_text(part, json.dumps(prof.to_json(), indent=1) + "\n")


def load_partial(part: Path, sha256: str, device: str) -> list[ProcessorProfile]:
    """The entries of a partial profile of the same model (by sha256) on the same device spec, or
    none."""
    if not part.exists():
        return []
    prev = load_profile(part)
    return list(prev.entries) if (prev.model_sha256, prev.device) == (sha256, device) else []
