"""DeviceSpec: the processors of a device, the servers it can reach, and the links between them.

Specs live in the top-level ``devices/`` folder as YAML (an installed wheel carries a copy, see
:func:`edgesplit.util.shipped_dir`) and are validated with a JSON schema; every error names the
file and the key. ``host`` is this machine, detected at run time.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgesplit.device.schema import (
    BACKENDS,
    KINDS,
    PRECISIONS,
    BackendKind,
    device_to_mapping,
    read_yaml,
    validate,
)
from edgesplit.errors import DeviceSpecError
from edgesplit.util import shipped_dir

__all__ = [
    "BACKENDS",
    "KINDS",
    "PRECISIONS",
    "Backend",
    "BackendKind",
    "DeviceSpec",
    "NetworkLink",
    "Processor",
    "SpecSource",
    "core_group",
    "device_from_mapping",
    "device_to_mapping",
    "load_device",
    "load_links",
    "network_link",
    "plain_cpu",
    "read_spec",
    "resolve",
    "shares_cores",
    "validate",
]

DEVICES_DIR = shipped_dir("devices")
"""Where the shipped specs live: top-level ``devices/`` in a checkout, ``edgesplit/_data/devices/``
in an installed wheel. ``EDGESPLIT_DEVICES`` adds folders, searched first."""


@dataclass(frozen=True)
class Backend:
    """How a processor runs a part: an ORT execution provider, or a TVM target.

    ``ops_only`` / ``ops_exclude`` narrow the processor's op support for this backend alone
    (TVM has no LSTM converter, for example). ``precision`` is what its parts run in, from its
    kind (:data:`BACKENDS`): ``fp32``, ``fp16`` or ``int8``.
    """

    runtime: str  # a key of BACKENDS: "ort", "tvm", "ort-int8", "ort-fp16" ...
    provider: str = "CPUExecutionProvider"
    options: Mapping[str, Any] = field(default_factory=dict)
    target: Mapping[str, Any] | None = None
    ops_only: frozenset[str] | None = None
    ops_exclude: frozenset[str] = frozenset()
    precision: str = "fp32"

    @property
    def key(self) -> str:
        """Short name used in profiles and plans: ``ort`` or ``tvm``."""
        return self.runtime

    def supports(self, op_type: str) -> bool:
        if self.ops_only is not None and op_type not in self.ops_only:
            return False
        return op_type not in self.ops_exclude


@dataclass(frozen=True)
class Processor:
    """One processor: a CPU cluster, a GPU, an NPU or DSP, on a device or a server."""

    name: str
    """Its key under the spec's ``processors``; ``<server>.<processor>`` for a server's."""
    kind: str
    """``cpu``, ``gpu``, ``npu`` or ``dsp``."""
    backends: tuple[Backend, ...]
    """How it runs a part, in the spec's order."""
    peak_gflops: float
    """Datasheet peak compute, in GFLOP/s, for the roofline prediction."""
    mem_bandwidth_gbps: float
    """Datasheet memory bandwidth, in gigabytes (not bits) per second, for the roofline."""
    active_w: float
    """Power while it runs a node, in watts: a predicted node's energy is this times its latency."""
    idle_w: float
    """Power while the device waits and it runs nothing, in watts."""
    launch_overhead_ms: float = 0.01
    """Fixed cost of one node, in ms, added to the roofline prediction."""
    memory_mb: float | None = None
    """What its nodes may hold, in MB (10^6 bytes); None: no limit of its own."""
    ops_only: frozenset[str] | None = None
    """The spec's ``ops.only``: the ONNX op types it runs, every other refused; None: no list."""
    ops_exclude: frozenset[str] = frozenset()
    """The spec's ``ops.exclude``: ONNX op types it never runs."""
    dtypes: tuple[str, ...] | None = None
    """Tensor element types its nodes may take (``float32``, ``int8`` ...); None: any."""
    cores: tuple[int, ...] | None = None
    """The CPU cores its threads are pinned to, when profiling and running; None: not pinned."""
    threads: int | None = None
    """ONNX Runtime intra-op threads; None: one per core in ``cores``, else the runtime's choice."""
    cpu_quota_pct: float | None = None
    """The share of its cores its work gets, in percent (an emulated little core); None: all."""
    server: str | None = None
    """The server spec's name when the processor is remote (:meth:`DeviceSpec.with_server`)."""
    description: str = ""
    spec_precisions: tuple[str, ...] | None = None
    """The spec's ``precisions`` list as written (None when absent); read :attr:`precisions`."""
    members: tuple[str, ...] = ()
    """For a core group, the CPU processors whose cores it runs on (see :func:`core_group`)."""
    core_quotas: tuple[tuple[int, float], ...] = ()
    """For a core group, ``(core, cpu_quota_pct)`` of each member core that keeps a quota."""

    @property
    def is_remote(self) -> bool:
        return self.server is not None

    @property
    def is_group(self) -> bool:
        """A core group: the cores of several CPU processors run one part together (see
        :func:`core_group`)."""
        return bool(self.members)

    @property
    def precisions(self) -> tuple[str, ...]:
        """What this processor runs: the spec's ``precisions`` list, else its backends' precisions.
        A processor whose list is ``[int8]`` has only int8 backends (checked when the spec loads),
        so it never gets an fp32 part."""
        if self.spec_precisions is not None:
            return self.spec_precisions
        return tuple(dict.fromkeys(b.precision for b in self.backends))

    def supports(self, op_type: str, dtypes: tuple[str, ...] = ()) -> bool:
        """Whether any backend of this processor can run ``op_type`` on these dtypes."""
        if self.ops_only is not None and op_type not in self.ops_only:
            return False
        if op_type in self.ops_exclude:
            return False
        if self.dtypes is not None and any(d not in self.dtypes for d in dtypes):
            return False
        return any(b.supports(op_type) for b in self.backends)

    def backend(self, key: str) -> Backend:
        for b in self.backends:
            if b.key == key:
                return b
        raise DeviceSpecError(f"processor '{self.name}' has no '{key}' backend")


@dataclass(frozen=True)
class NetworkLink:
    """A network link between the device and a server (Wi-Fi, LTE, 5G, or given by flags)."""

    name: str
    """The preset's name in ``links.yaml`` (``wifi``, ``lte`` ...); empty for flags alone."""
    up_mbps: float
    """Device-to-server rate, in megabits per second."""
    down_mbps: float
    """Server-to-device rate, in megabits per second."""
    rtt_ms: float
    """Round-trip time, paid once per transfer whichever way it goes."""
    tx_power_w: float
    """The radio's power while sending at ``up_mbps``, in watts (the whole phone's)."""
    rx_power_w: float
    """The radio's power while receiving at ``down_mbps``, in watts."""
    description: str = ""


@dataclass(frozen=True)
class DeviceSpec:
    """A device (or server): its processors and the on-chip links between them."""

    name: str
    kind: str
    """``device`` or ``server``."""
    processors: tuple[Processor, ...]
    """The spec's processors in its order, then its core groups (:func:`core_group`), then a
    server's (:meth:`with_server`)."""
    path: str = ""
    """The file it was read from, or what errors name for a spec that came another way."""
    description: str = ""
    memory_mb: float | None = None
    """What all its processors' nodes may hold together, in MB (10^6 bytes); None: no limit."""
    links: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    """``(a, b) -> (bandwidth_gbps, latency_ms)`` for on-chip copies; pairs not listed use
    ``default_link``."""
    default_link: tuple[float, float] = (10.0, 0.02)
    """``(bandwidth_gbps, latency_ms)`` of an on-chip copy between processors ``links`` omits."""
    servers: tuple[str, ...] = ()
    """The server specs it can reach, by name, as its spec lists them (``--server`` picks one)."""
    local: bool = False
    """True when the processors are on this machine and can be measured here."""

    def processor(self, name: str) -> Processor:
        for p in self.processors:
            if p.name == name:
                return p
        names = ", ".join(p.name for p in self.processors)
        raise DeviceSpecError(
            f"{self.path or self.name}: unknown processor '{name}' (processors: {names})"
        )

    @property
    def processor_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.processors)

    def onchip_link(self, a: str, b: str) -> tuple[float, float]:
        """``(bandwidth_gbps, latency_ms)`` of a copy between two processors of this device."""
        return self.links.get((a, b)) or self.links.get((b, a)) or self.default_link

    def with_server(self, server: DeviceSpec) -> DeviceSpec:
        """This device plus a server's processors, named ``<server>.<processor>``."""
        remote = tuple(
            replace(p, name=f"{server.name}.{p.name}", server=server.name)
            for p in server.processors
        )
        return replace(self, processors=self.processors + remote)


def search_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("EDGESPLIT_DEVICES", "").split(os.pathsep) if p]
    return [*extra, DEVICES_DIR]


def list_specs() -> list[Path]:
    """Every spec file in the search folders, by name."""
    seen: dict[str, Path] = {}
    for d in search_dirs():
        for p in sorted(d.glob("*.yaml")):
            seen.setdefault(p.stem, p)
    return [seen[k] for k in sorted(seen)]


def resolve(name_or_path: str | os.PathLike) -> Path:
    """A spec name (``snapdragon-8gen2``) or a path to a YAML file -> the file."""
    text = str(name_or_path)
    p = Path(text)
    if p.suffix in (".yaml", ".yml") or os.sep in text or p.exists():
        if p.is_dir():
            raise DeviceSpecError(f"{text}: is a directory, not a device spec file")
        if not p.exists():
            raise DeviceSpecError(f"{text}: no such device spec file")
        return p
    for d in search_dirs():
        cand = d / f"{text}.yaml"
        if cand.is_file():
            return cand
    names = ", ".join(q.stem for q in list_specs() if q.stem != "links")
    raise DeviceSpecError(f"unknown device '{text}' (known: {names})")


def _ops(d: Mapping[str, Any] | None) -> tuple[frozenset[str] | None, frozenset[str]]:
    d = d or {}
    only = frozenset(d["only"]) if "only" in d else None
    return only, frozenset(d.get("exclude", ()))


def _backend(proc: str, i: int, b: Mapping[str, Any], source: str) -> Backend:
    kind = BACKENDS[b["runtime"]]
    for key in kind.requires:
        if key not in b:
            raise DeviceSpecError(
                f"{source}: processors.{proc}.backends.{i}.{key}: a {b['runtime']} backend needs a "
                f"{key}"
            )
    only, excl = _ops(b.get("ops"))
    target = b.get("target")
    if target is not None and target.get("mcpu") == "native":
        from edgesplit.device.host import llvm_target

        target = {**llvm_target(), **{k: v for k, v in target.items() if k != "mcpu"}}
    return Backend(
        runtime=b["runtime"],
        provider=b.get("provider", "CPUExecutionProvider"),
        options=dict(b.get("options", {})),
        target=target,
        ops_only=only,
        ops_exclude=excl,
        precision=kind.precision,
    )


def _check_precisions(name: str, backends: tuple[Backend, ...], listed: Any, source: str) -> None:
    """Every backend of a processor that lists its precisions runs one of them."""
    if listed is None:
        return
    for i, b in enumerate(backends):
        if b.precision not in listed:
            raise DeviceSpecError(
                f"{source}: processors.{name}.backends.{i}.runtime: '{b.runtime}' runs "
                f"{b.precision}, "
                f"which processors.{name}.precisions {list(listed)} leaves out"
            )


def _processor(name: str, d: Mapping[str, Any], source: str) -> Processor:
    only, excl = _ops(d.get("ops"))
    backends = tuple(_backend(name, i, b, source) for i, b in enumerate(d["backends"]))
    _check_precisions(name, backends, d.get("precisions"), source)
    return Processor(
        name=name,
        kind=d["kind"],
        backends=backends,
        peak_gflops=float(d["peak_gflops"]),
        mem_bandwidth_gbps=float(d["mem_bandwidth_gbps"]),
        active_w=float(d["active_w"]),
        idle_w=float(d["idle_w"]),
        launch_overhead_ms=float(d.get("launch_overhead_ms", 0.01)),
        memory_mb=d.get("memory_mb"),
        ops_only=only,
        ops_exclude=excl,
        dtypes=tuple(d["dtypes"]) if "dtypes" in d else None,
        cores=tuple(d["cores"]) if "cores" in d else None,
        threads=d.get("threads"),
        cpu_quota_pct=d.get("cpu_quota_pct"),
        description=d.get("description", ""),
        spec_precisions=tuple(d["precisions"]) if "precisions" in d else None,
    )


def device_from_mapping(
    data: Mapping[str, Any],
    source: str | os.PathLike = "<spec>",
    *,
    local: bool | None = None,
    validated: bool = False,
) -> DeviceSpec:
    """The one way from a spec mapping (parsed YAML, or JSON from a remote client) to a DeviceSpec.

    Validates against the schema, detects ``detect: true`` specs on the machine that runs this,
    and checks what the schema cannot (backend keys, link ends). :func:`load_device` and the
    remote profiling agent both come through here.

    Args:
        source: What to name in errors (the file, or ``name (on host)``); kept as
        ``DeviceSpec.path``.
        local: Overrides the spec's ``local`` (the agent profiles the device it runs on).
        validated: The mapping passed the schema already (the remote agent's spec, checked by the
            client), so it is not checked again: a board needs no jsonschema.

    Raises:
        DeviceSpecError: naming ``source`` and the key at fault.
    """
    src = str(source)
    if not validated:
        validate(data, src)
    if data["kind"] == "links":
        raise DeviceSpecError(f"{src}: is a link preset file, not a device")
    data = dict(data)
    if data.get("detect"):
        from edgesplit.device.host import detect_host

        data = detect_host(data)
    procs = tuple(_processor(n, d, src) for n, d in data["processors"].items())
    procs += _groups(data, procs, src)
    names = {p.name for p in procs}
    links: dict[tuple[str, str], tuple[float, float]] = {}
    for i, link in enumerate(data.get("links", [])):
        a, b = link["between"]
        for end in (a, b):
            if end not in names:
                raise DeviceSpecError(f"{src}: links.{i}.between: unknown processor '{end}'")
        links[(a, b)] = (float(link["bandwidth_gbps"]), float(link["latency_ms"]))
    dl = data.get("default_link", {"bandwidth_gbps": 10.0, "latency_ms": 0.02})
    return DeviceSpec(
        name=data["name"],
        kind=data["kind"],
        processors=procs,
        path=src,
        description=data.get("description", ""),
        memory_mb=data.get("memory_mb"),
        links=links,
        default_link=(float(dl["bandwidth_gbps"]), float(dl["latency_ms"])),
        servers=tuple(data.get("servers", ())),
        local=bool(data.get("local", False)) if local is None else local,
    )


def core_group(name: str, members: tuple[Processor, ...]) -> Processor:
    """One processor made of the cores of ``members`` (CPU processors with an fp32 ``ort`` backend):
    a part on it runs in ONNX Runtime with one intra-op thread per member thread, pinned to their
    cores, each member's core keeping its CPU quota (its duty cycle runs while the group works).

    Its peak FLOP/s and active power are the members' summed (every core works on each operator);
    its idle power is 0, as the members' idle power already counts while the group waits. It runs
    the ops every member runs.
    """
    onlys = [m.ops_only for m in members if m.ops_only is not None]
    dtypes = [set(m.dtypes) for m in members if m.dtypes is not None]
    cores = tuple(c for m in members for c in (m.cores or ()))
    quotas = tuple(
        (c, float(m.cpu_quota_pct)) for m in members if m.cpu_quota_pct for c in m.cores or ()
    )
    threads = sum(m.threads or len(m.cores or ()) or 1 for m in members)
    ort = next(b for b in members[0].backends if b.key == "ort")
    return Processor(
        name=name,
        kind="cpu",
        backends=(ort,),
        peak_gflops=sum(m.peak_gflops for m in members),
        mem_bandwidth_gbps=max(m.mem_bandwidth_gbps for m in members),
        active_w=sum(m.active_w for m in members),
        idle_w=0.0,
        launch_overhead_ms=max(m.launch_overhead_ms for m in members),
        ops_only=frozenset.intersection(*onlys) if onlys else None,
        ops_exclude=frozenset().union(*(m.ops_exclude for m in members)),
        dtypes=tuple(sorted(set.intersection(*dtypes))) if dtypes else None,
        cores=cores or None,
        threads=threads,
        description=f"the cores of {' and '.join(m.name for m in members)} together, "
        f"{threads} ONNX Runtime threads",
        members=tuple(m.name for m in members),
        core_quotas=quotas,
    )


def shares_cores(p: Processor, q: Processor) -> bool:
    """Whether two processors of a device run on a core in common (a core group and a member), so
    that the runtime never runs them at once."""
    if p.is_remote or q.is_remote:
        return False
    if p.name in q.members or q.name in p.members:
        return True
    return bool(set(p.cores or ()) & set(q.cores or ()))


def plain_cpu(device: DeviceSpec) -> Processor | None:
    """What plain ONNX Runtime runs on, on this device: every CPU core it has, with ORT's defaults.
    That is the core group of all its CPU processors, or its one CPU processor; None for a device
    whose CPU processors no group covers (a spec that lists other groups)."""
    cpus = [p for p in device.processors if not p.is_remote and not p.is_group and _groupable(p)]
    names = {p.name for p in cpus}
    for g in device.processors:
        if g.is_group and set(g.members) == names:
            return g
    return cpus[0] if len(cpus) == 1 else None


def _groupable(p: Processor) -> bool:
    return p.kind == "cpu" and "fp32" in p.precisions and any(b.key == "ort" for b in p.backends)


def _groups(
    data: Mapping[str, Any], procs: tuple[Processor, ...], src: str
) -> tuple[Processor, ...]:
    """The spec's core groups: those it lists under ``groups`` (``{}`` for none), else one group of
    every CPU processor when a device has two or more that share no core (its name joins theirs
    with ``+``)."""
    if data["kind"] != "device" and "groups" not in data:
        return ()
    by_name = {p.name: p for p in procs}
    listed = data.get("groups")
    if listed is None:  # derived: only where the CPU processors hold cores of their own
        cpus = tuple(p for p in procs if _groupable(p))
        cores = [c for p in cpus for c in p.cores or ()]
        if len(cpus) < 2 or len(cores) != len(set(cores)):
            return ()
        return (core_group("+".join(p.name for p in cpus), cpus),)
    out = []
    for name, member_names in listed.items():
        where = f"{src}: groups.{name}"
        if name in by_name:
            raise DeviceSpecError(f"{where}: a processor is already named '{name}'")
        members = []
        for m in member_names:
            if m not in by_name:
                raise DeviceSpecError(f"{where}: unknown processor '{m}'")
            if not _groupable(by_name[m]):
                raise DeviceSpecError(
                    f"{where}: '{m}' is not a CPU processor with an fp32 ort backend"
                )
            members.append(by_name[m])
        seen: set[int] = set()
        for m in members:
            if seen & set(m.cores or ()):
                raise DeviceSpecError(f"{where}: '{m.name}' shares cores with another member")
            seen |= set(m.cores or ())
        out.append(core_group(name, tuple(members)))
    return tuple(out)


@dataclass(frozen=True)
class SpecSource:
    """A spec file read and validated, not yet turned into a DeviceSpec.

    What remote profiling sends to the device: a ``detect: true`` spec (``host``) must be detected
    there, not here. :meth:`load` makes the DeviceSpec on this machine.
    """

    data: Mapping[str, Any]
    path: str

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def kind(self) -> str:
        return str(self.data["kind"])

    def load(self, *, local: bool | None = None) -> DeviceSpec:
        return device_from_mapping(self.data, self.path, local=local)


def read_spec(name_or_path: str | os.PathLike) -> SpecSource:
    """A spec by name or path, read and validated (detection, if any, is left to
    :meth:`SpecSource.load`)."""
    path = resolve(name_or_path)
    data = read_yaml(path)
    validate(data, path)
    return SpecSource(data, str(path))


def load_device(name_or_path: str | os.PathLike) -> DeviceSpec:
    """Load and validate a device or server spec by name or path.

    Raises:
        DeviceSpecError: naming the file and the key at fault.
    """
    return read_spec(name_or_path).load()


def load_links(path: str | os.PathLike | None = None) -> dict[str, NetworkLink]:
    """The network link presets (``devices/links.yaml``): wifi, lte, 5g ..."""
    p = Path(path) if path else resolve("links")
    data = read_yaml(p)
    validate(data, p)
    if data["kind"] != "links":
        raise DeviceSpecError(f"{p}: kind: expected 'links', got '{data['kind']}'")
    return {
        name: NetworkLink(
            name=name,
            description=d.get("description", ""),
            **{
                k: float(d[k])
                for k in ("up_mbps", "down_mbps", "rtt_ms", "tx_power_w", "rx_power_w")
            },
        )
        for name, d in data["presets"].items()
    }


def network_link(
    preset: NetworkLink | str | None,
    *,
    bandwidth_mbps: float | None = None,
    rtt_ms: float | None = None,
) -> NetworkLink:
    """A preset (by name, or a link as it is), overridden by flags; with no preset, flags alone
    (radio power of Wi-Fi)."""
    if isinstance(preset, NetworkLink):
        base = preset
    else:
        presets = load_links()
        if preset is not None and preset not in presets:
            raise DeviceSpecError(f"unknown link '{preset}' (presets: {', '.join(presets)})")
        base = presets[preset or "wifi"]
    if bandwidth_mbps is not None:
        if not _finite(bandwidth_mbps) or bandwidth_mbps <= 0:
            raise DeviceSpecError(
                f"--bandwidth-mbps must be a positive finite number, got {bandwidth_mbps}"
            )
        base = replace(
            base,
            name=f"{base.name.split('@')[0]}@{bandwidth_mbps:g}mbps",
            up_mbps=bandwidth_mbps,
            down_mbps=bandwidth_mbps,
        )
    if rtt_ms is not None:
        if not _finite(rtt_ms) or rtt_ms < 0:
            raise DeviceSpecError(f"--rtt-ms must be a finite number, not negative, got {rtt_ms}")
        base = replace(base, rtt_ms=rtt_ms)
    return base


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def machine_summary() -> str:
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores"
