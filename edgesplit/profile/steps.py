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
from typing import Any

from edgesplit.device import DeviceSpec
from edgesplit.model.graph import ModelGraph
from edgesplit.profile.power import PowerSampler, Rails, find_rails
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile, Profile, load_profile
from edgesplit.util import atomic_write_text

Progress = Callable[[str, int, int], None]
OnEntry = Callable[[ProcessorProfile], None]


def device_from_dict(data: Mapping[str, Any], source: str = "<spec>", *, local: bool = True) -> DeviceSpec:
    """A DeviceSpec from an already-validated spec mapping (the agent gets it as JSON).

    ``detect: true`` specs are detected here (on the machine that runs this).
    """
    from edgesplit.device import _processor

    data = dict(data)
    if data.get("detect"):
        from edgesplit.hostinfo import detect_host

        data = detect_host(data)
    procs = tuple(_processor(n, d, source) for n, d in data["processors"].items())
    links = {
        tuple(link["between"]): (float(link["bandwidth_gbps"]), float(link["latency_ms"]))
        for link in data.get("links", [])
    }
    dl = data.get("default_link", {"bandwidth_gbps": 10.0, "latency_ms": 0.02})
    return DeviceSpec(
        name=data["name"],
        kind=data["kind"],
        processors=procs,
        path=source,
        description=data.get("description", ""),
        memory_mb=data.get("memory_mb"),
        links=links,
        default_link=(float(dl["bandwidth_gbps"]), float(dl["latency_ms"])),
        servers=tuple(data.get("servers", ())),
        local=local,
    )


def pairs(device: DeviceSpec, backends: Sequence[str] | None, processors: Sequence[str] | None) -> list[str]:
    """The ``processor/backend`` keys a profile of ``device`` has, in profile order."""
    for name in processors or ():
        device.processor(name)  # raises on unknown names
    return [
        f"{p.name}/{b.key}"
        for p in device.processors
        if not processors or p.name in processors
        for b in p.backends
        if not backends or b.runtime in backends
    ]


def with_energy(entry: ProcessorProfile, power_w: float, how: str) -> ProcessorProfile:
    """``entry`` with each measured node's energy = ``power_w`` x its latency (W x ms = mJ)."""
    nodes = {
        name: dataclasses.replace(c, energy_mj=round(power_w * c.latency_ms, 6))
        if c.source == MEASURED
        else c
        for name, c in entry.nodes.items()
    }
    note = "; ".join(x for x in (entry.note, how) if x)
    return dataclasses.replace(entry, nodes=nodes, note=note)


def profile_steps(
    graph: ModelGraph,
    device: DeviceSpec,
    *,
    backends: Sequence[str] | None = None,
    processors: Sequence[str] | None = None,
    runs: int = 20,
    warmup: int = 5,
    progress: Progress | None = None,
    done: Sequence[ProcessorProfile] = (),
    on_entry: OnEntry | None = None,
    rails: Rails | None = None,
    sysfs_root: str = "/",
) -> Profile:
    """Profile ``graph`` on ``device`` pair by pair; see the module docstring.

    Args:
        done: Entries measured earlier (a resumed run); their pairs are not measured again.
        on_entry: Called with each newly finished entry, in order.
        rails: The power rails to sample (default: those found under ``sysfs_root``).
    """
    from edgesplit.profile.run import profile_model

    rails = find_rails(sysfs_root) if rails is None else rails
    kept = {e.key: e for e in done}
    entries: list[ProcessorProfile] = []
    measured_energy = any("energy measured" in e.note for e in kept.values())
    meta: Profile | None = None
    for key in pairs(device, backends, processors):
        if key in kept:
            entries.append(kept[key])
            continue
        proc, backend = key.split("/")
        window: dict[str, float] = {}
        with PowerSampler(rails) as sampler:

            def tick(
                label: str,
                n: int,
                total: int,
                sampler: PowerSampler = sampler,
                window: dict[str, float] = window,
            ) -> None:
                if rails and ("t0" not in window or n == total):
                    window.setdefault("t0", sampler.mark())
                    if n == total:
                        window["t1"] = sampler.mark()
                if progress is not None:
                    progress(label, n, total)

            start = sampler.mark()
            meta = profile_model(
                graph, device, backends=[backend], processors=[proc], runs=runs, warmup=warmup, progress=tick
            )
            end = sampler.mark()
        entry = meta.entries[0]
        if rails and entry.source == MEASURED and entry.nodes:
            t0, t1 = window.get("t0", start), window.get("t1", end)
            if t1 - t0 < 0.05:
                t0, t1 = start, end
            power_w = sampler.mean_power_w(t0, t1)
            if power_w is not None:
                entry = with_energy(
                    entry,
                    power_w,
                    f"energy measured: {rails.source} mean {power_w:.2f} W over {t1 - t0:.1f} s",
                )
                measured_energy = True
        entries.append(entry)
        if on_entry is not None:
            on_entry(entry)
    if meta is None:  # everything came from ``done``: the metadata of a fresh, empty run
        meta = profile_model(graph, device, processors=[device.processors[0].name], backends=["none"])
    return dataclasses.replace(
        meta, entries=tuple(entries), energy="measured" if measured_energy else "modelled"
    )


def entry_from_json(d: Mapping[str, Any]) -> ProcessorProfile:
    """One entry of a profile JSON (the agent's checkpoints)."""
    return dataclasses.replace(
        ProcessorProfile(d["processor"], d["backend"], d["source"], {}),
        nodes={k: NodeCost(**v) for k, v in d["nodes"].items()},
        unsupported=dict(d.get("unsupported", {})),
        whole_model_ms=d.get("whole_model_ms"),
        whole_model_p90_ms=d.get("whole_model_p90_ms"),
        note=d.get("note", ""),
        elapsed_s=d.get("elapsed_s", 0.0),
    )


def entry_to_json(e: ProcessorProfile) -> dict[str, Any]:
    return dataclasses.asdict(e)


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
    """The entries of a partial profile of the same model (by sha256) on the same device spec, or none."""
    if not part.exists():
        return []
    prev = load_profile(part)
    return list(prev.entries) if (prev.model_sha256, prev.device) == (sha256, device) else []
