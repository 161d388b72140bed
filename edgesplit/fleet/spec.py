"""The fleet file: groups of devices and the one server they share (YAML, schema-checked).

::

    include: [more-phones.yaml]      # other fleet files whose groups join these (no cycles)
    server:
      spec: server-h200              # a server spec, by name or path
      profiles:                      # optional: the model measured on the server, per model
        squeezenet: profiles/squeezenet.server-h200.profile.json
      slots: 4                       # requests (batches) computed at once
      max_batch: 16                  # serve --max-batch
      max_queue_delay_ms: 4          # serve --max-queue-delay-ms (the planner may shorten it)
      max_replicas: 2                # servers the planner may use (default 1)
    groups:
      - name: phones
        model: squeezenet            # a zoo name or an ONNX file
        spec: snapdragon-8gen2       # a device spec, by name or path
        count: 200
        rate_per_s: 2                # requests a device sends a second (default 1)
        link: wifi                   # a preset of devices/links.yaml, or:
        # band: {bandwidth_mbps: 5, rtt_ms: 40}
        deadline_p95_ms: 50
        objective: energy            # or latency (default energy)

Paths are relative to the file that names them. Every error is one line naming the file and the
field, an :class:`~edgesplit.errors.InputError` (the CLI exits 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.errors import DeviceSpecError, InputError
from edgesplit.util import short

MAX_FILES = 64
"""Fleet files read at most through includes."""

_POS = {"type": "number", "exclusiveMinimum": 0}
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$", "maxLength": 64}
_GROUP = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "model", "spec", "count", "deadline_p95_ms"],
    "properties": {
        "name": _NAME,
        "model": {"type": "string", "minLength": 1},
        "spec": {"type": "string", "minLength": 1},
        "profile": {"type": "string", "minLength": 1},
        "count": {"type": "integer", "minimum": 1},
        "rate_per_s": _POS,
        "link": {"type": "string", "minLength": 1},
        "band": {
            "type": "object",
            "additionalProperties": False,
            "required": ["bandwidth_mbps"],
            "properties": {"bandwidth_mbps": _POS, "rtt_ms": {"type": "number", "minimum": 0}},
        },
        "deadline_p95_ms": _POS,
        "objective": {"enum": ["energy", "latency"]},
    },
    "not": {"required": ["link", "band"]},
}
_SERVER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["spec"],
    "properties": {
        "spec": {"type": "string", "minLength": 1},
        "profiles": {"type": "object", "additionalProperties": {"type": "string"}},
        "slots": {"type": "integer", "minimum": 1, "maximum": 4096},
        "max_batch": {"type": "integer", "minimum": 1, "maximum": 4096},
        "max_queue_delay_ms": {"type": "number", "minimum": 0, "maximum": 60000},
        "max_replicas": {"type": "integer", "minimum": 1, "maximum": 1024},
    },
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "include": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "server": _SERVER,
        "groups": {"type": "array", "items": _GROUP},
    },
}


@dataclass(frozen=True)
class GroupSpec:
    """One group of the fleet file (paths made absolute where they name files that exist)."""

    name: str
    model: str
    spec: str
    count: int
    deadline_p95_ms: float
    rate_per_s: float = 1.0
    link: str | None = None
    bandwidth_mbps: float | None = None
    rtt_ms: float | None = None
    objective: str = "energy"
    profile: str | None = None
    source: str = ""


@dataclass(frozen=True)
class ServerSpec:
    """The server of the fleet file."""

    spec: str
    profiles: dict[str, str]
    slots: int = 1
    max_batch: int = 1
    max_queue_delay_ms: float = 0.0
    max_replicas: int = 1
    source: str = ""


@dataclass(frozen=True)
class FleetSpec:
    """A fleet file with its includes read: every group, and the server."""

    path: str
    groups: tuple[GroupSpec, ...]
    server: ServerSpec


class FleetError(InputError):
    """A fleet file that is malformed or names something unknown (exit code 2)."""


def _validate(data: Any, path: Path) -> None:
    import jsonschema

    from edgesplit.device.schema import check_values

    try:
        check_values(data, path)
    except DeviceSpecError as e:
        raise FleetError(str(e)) from e
    errors = sorted(
        jsonschema.Draft202012Validator(SCHEMA).iter_errors(data),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    if errors:
        msgs = []
        for e in errors[:5]:
            key = ".".join(str(k) for k in e.absolute_path) or "(top)"
            message = e.message
            if e.validator == "not":
                message = "give a link or a band, not both"
            msgs.append(f"{short(key, 120)}: {short(message, 200)}")
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise FleetError(f"{path}: " + "; ".join(msgs) + more)


def _local(value: str, base: Path) -> str:
    """``value`` as a path relative to ``base`` when that file exists, else as given (a name)."""
    p = Path(os.path.expanduser(value))
    p = p if p.is_absolute() else base / p
    return str(p) if p.exists() else value


def _read(path: Path) -> dict[str, Any]:
    from edgesplit.device.schema import load_yaml

    data = load_yaml(path, FleetError, "fleet file")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FleetError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    _validate(data, path)
    return data


def _group(g: dict[str, Any], base: Path, source: str) -> GroupSpec:
    band = g.get("band") or {}
    return GroupSpec(
        name=g["name"],
        model=_local(g["model"], base),
        spec=_local(g["spec"], base),
        count=int(g["count"]),
        deadline_p95_ms=float(g["deadline_p95_ms"]),
        rate_per_s=float(g.get("rate_per_s", 1.0)),
        link=g.get("link"),
        bandwidth_mbps=band.get("bandwidth_mbps"),
        rtt_ms=band.get("rtt_ms"),
        objective=g.get("objective", "energy"),
        profile=_local(g["profile"], base) if "profile" in g else None,
        source=source,
    )


def _server(s: dict[str, Any], base: Path, source: str) -> ServerSpec:
    return ServerSpec(
        spec=_local(s["spec"], base),
        profiles={k: _local(v, base) for k, v in (s.get("profiles") or {}).items()},
        slots=int(s.get("slots", 1)),
        max_batch=int(s.get("max_batch", 1)),
        max_queue_delay_ms=float(s.get("max_queue_delay_ms", 0.0)),
        max_replicas=int(s.get("max_replicas", 1)),
        source=source,
    )


def load_fleet(path: str | os.PathLike) -> FleetSpec:
    """Read a fleet file and its includes (depth first; a file included twice is read once).

    Raises:
        FleetError: one line naming the file and the field: malformed YAML, an unknown key, a
            count below 1, a deadline not above 0, an include that is missing or makes a cycle,
            two groups of one name, two servers or none, no group.
    """
    top = Path(path)
    groups: list[GroupSpec] = []
    servers: list[ServerSpec] = []
    done: set[Path] = set()

    def visit(p: Path, chain: tuple[Path, ...]) -> None:
        real = p.resolve()
        if real in chain:
            names = " -> ".join(str(c) for c in (*chain, real))
            raise FleetError(f"{chain[-1]}: include: a cycle ({names})")
        if real in done:
            return
        if len(done) >= MAX_FILES:
            raise FleetError(f"{top}: include: more than {MAX_FILES} fleet files")
        data = _read(p)
        done.add(real)
        for i, inc in enumerate(data.get("include", [])):
            target = Path(os.path.expanduser(inc))
            target = target if target.is_absolute() else p.parent / target
            if not target.is_file():
                raise FleetError(f"{p}: include.{i}: no fleet file {short(inc, 120)}")
            visit(target, (*chain, real))
        if "server" in data:
            servers.append(_server(data["server"], p.parent, str(p)))
        groups.extend(_group(g, p.parent, str(p)) for g in data.get("groups", []))

    visit(top, ())
    if len(servers) != 1:
        where = ", ".join(s.source for s in servers)
        raise FleetError(
            f"{top}: server: the fleet needs one server, found {len(servers)}"
            + (f" (in {where})" if where else "")
        )
    if not groups:
        raise FleetError(f"{top}: groups: the fleet has no group")
    seen: dict[str, str] = {}
    for g in groups:
        if g.name in seen:
            raise FleetError(f"{g.source}: groups: '{g.name}' is named twice (also {seen[g.name]})")
        seen[g.name] = g.source
    return FleetSpec(str(top), tuple(groups), servers[0])
