"""The device spec file format: its JSON schema, the backend kinds a spec may name, its writer.

Kept apart from :mod:`edgesplit.device` (the dataclasses, and the reader
:func:`~edgesplit.device.device_from_mapping`) so that the format is one page to read. The
schema's ``runtime`` enum is built from :data:`BACKENDS` when a spec is validated, so a backend
registered at run time is accepted without editing the schema.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesplit.errors import DeviceSpecError

if TYPE_CHECKING:
    from edgesplit.device import Backend, DeviceSpec, Processor

KINDS = ("cpu", "gpu", "npu", "dsp")

_NUM = {"type": "number", "exclusiveMinimum": 0}
_NUM0 = {"type": "number", "minimum": 0}
_OPS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}


@dataclass(frozen=True)
class BackendKind:
    """What a device spec must say for one kind of backend (the ``runtime`` key of a backend).

    Attributes:
        requires: Keys a backend entry of this kind must have (TVM needs its ``target``).
        summary: One line for ``edgesplit devices`` and error messages.
    """

    requires: tuple[str, ...] = ()
    summary: str = ""


# The backend kinds a spec may name, by ``runtime``: the schema's enum is built from this table.
# A new backend adds one line here and one in each stage's table (profile/backends.py,
# compile/backends.py, runtime/backends.py); nothing else branches on backend names.
BACKENDS: dict[str, BackendKind] = {
    "ort": BackendKind((), "ONNX Runtime with an execution provider"),
    "tvm": BackendKind(("target",), "Apache TVM, compiled for a target"),
}

_BACKEND = {
    "type": "object",
    "additionalProperties": False,
    "required": ["runtime"],
    "properties": {
        "runtime": {"type": "string"},  # checked against BACKENDS in schema()
        "provider": {"type": "string"},
        "options": {"type": "object"},
        "target": {"type": "object", "required": ["kind"]},
        "ops": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"only": _OPS, "exclude": _OPS},
        },
    },
}
_PROCESSOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "backends", "peak_gflops", "mem_bandwidth_gbps", "active_w", "idle_w"],
    "properties": {
        "kind": {"enum": list(KINDS)},
        "description": {"type": "string"},
        "backends": {"type": "array", "minItems": 1, "items": _BACKEND},
        "ops": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"only": _OPS, "exclude": _OPS},
        },
        "dtypes": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "cores": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        "threads": {"type": "integer", "minimum": 1},
        "cpu_quota_pct": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
        "peak_gflops": _NUM,
        "mem_bandwidth_gbps": _NUM,
        "launch_overhead_ms": _NUM0,
        "memory_mb": _NUM,
        "active_w": _NUM0,
        "idle_w": _NUM0,
    },
}
_LINK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["between", "bandwidth_gbps", "latency_ms"],
    "properties": {
        "between": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
        "bandwidth_gbps": _NUM,
        "latency_ms": _NUM0,
    },
}
_NETWORK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["up_mbps", "down_mbps", "rtt_ms", "tx_power_w", "rx_power_w"],
    "properties": {
        "description": {"type": "string"},
        "up_mbps": _NUM,
        "down_mbps": _NUM,
        "rtt_ms": _NUM0,
        "tx_power_w": _NUM0,
        "rx_power_w": _NUM0,
    },
}
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "kind"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
        "kind": {"enum": ["device", "server", "links"]},
        "description": {"type": "string"},
        "detect": {"type": "boolean"},
        "local": {"type": "boolean"},
        "memory_mb": _NUM,
        "processors": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": _PROCESSOR,
            "propertyNames": {"pattern": "^[A-Za-z0-9_]+$"},
        },
        "links": {"type": "array", "items": _LINK},
        "default_link": {
            "type": "object",
            "additionalProperties": False,
            "required": ["bandwidth_gbps", "latency_ms"],
            "properties": {"bandwidth_gbps": _NUM, "latency_ms": _NUM0},
        },
        "presets": {"type": "object", "minProperties": 1, "additionalProperties": _NETWORK},
        "servers": {"type": "array", "items": {"type": "string"}},
    },
    "allOf": [
        {
            "if": {"required": ["kind"], "properties": {"kind": {"const": "links"}}},
            "then": {"required": ["presets"]},
            "else": {"required": ["processors"]},
        },
    ],
}


def schema() -> dict[str, Any]:
    """The spec schema, with the backend kinds registered now in the ``runtime`` enum."""
    s = copy.deepcopy(_SCHEMA)
    backend = s["properties"]["processors"]["additionalProperties"]["properties"]["backends"]["items"]
    backend["properties"]["runtime"] = {"enum": list(BACKENDS)}
    return s


def validate(data: Any, path: Path | str) -> None:
    """Check a spec against the schema; the error names the file and every bad key (up to 5)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        msgs = []
        for e in errors[:5]:
            key = ".".join(str(k) for k in e.absolute_path) or "(top)"
            msgs.append(f"{key}: {e.message}")
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise DeviceSpecError(f"{path}: " + "; ".join(msgs) + more)


def _ops_json(only: frozenset[str] | None, exclude: frozenset[str]) -> dict[str, list[str]]:
    out = {"only": sorted(only)} if only is not None else {}
    return {**out, "exclude": sorted(exclude)} if exclude else out


def _backend_json(b: Backend) -> dict[str, Any]:
    out: dict[str, Any] = {"runtime": b.runtime, "provider": b.provider}
    if b.options:
        out["options"] = dict(b.options)
    if b.target is not None:
        out["target"] = dict(b.target)
    ops = _ops_json(b.ops_only, b.ops_exclude)
    return {**out, "ops": ops} if ops else out


def _processor_json(p: Processor) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": p.kind,
        "description": p.description,
        "backends": [_backend_json(b) for b in p.backends],
        "peak_gflops": p.peak_gflops,
        "mem_bandwidth_gbps": p.mem_bandwidth_gbps,
        "launch_overhead_ms": p.launch_overhead_ms,
        "active_w": p.active_w,
        "idle_w": p.idle_w,
    }
    optional = {
        "memory_mb": p.memory_mb,
        "dtypes": list(p.dtypes) if p.dtypes is not None else None,
        "cores": list(p.cores) if p.cores is not None else None,
        "threads": p.threads,
        "cpu_quota_pct": p.cpu_quota_pct,
    }
    ops = _ops_json(p.ops_only, p.ops_exclude)
    return {**out, **({"ops": ops} if ops else {}), **{k: v for k, v in optional.items() if v is not None}}


def device_to_mapping(spec: DeviceSpec) -> dict[str, Any]:
    """A spec mapping that :func:`device_from_mapping` reads back to an equal DeviceSpec.

    The spec as it is now: a detected spec is written with its detected processors and without
    ``detect``. Server processors appended by :meth:`DeviceSpec.with_server` are not a spec file's
    and are refused.
    """
    if any(p.is_remote for p in spec.processors):
        raise DeviceSpecError(f"{spec.name}: holds a server's processors; write the specs apart")
    out: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "description": spec.description}
    if spec.memory_mb is not None:
        out["memory_mb"] = spec.memory_mb
    out["local"] = spec.local
    out["processors"] = {p.name: _processor_json(p) for p in spec.processors}
    out["links"] = [
        {"between": [a, b], "bandwidth_gbps": gbps, "latency_ms": ms}
        for (a, b), (gbps, ms) in spec.links.items()
    ]
    out["default_link"] = {"bandwidth_gbps": spec.default_link[0], "latency_ms": spec.default_link[1]}
    if spec.servers:
        out["servers"] = list(spec.servers)
    return out
