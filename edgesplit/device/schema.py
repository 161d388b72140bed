"""The device spec file format: its JSON schema, the backend kinds a spec may name, its writer.

Kept apart from :mod:`edgesplit.device.spec` (the dataclasses, and the reader
:func:`~edgesplit.device.spec.device_from_mapping`) so that the format is one page to read. The
schema's ``runtime`` enum is built from :data:`BACKENDS` when a spec is validated, so a backend
registered at run time is accepted without editing the schema.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from edgesplit.errors import DeviceSpecError
from edgesplit.util import read_file_bytes, short

if TYPE_CHECKING:
    from edgesplit.device.spec import Backend, DeviceSpec, Processor

KINDS = ("cpu", "gpu", "npu", "dsp")
MAX_SPEC_NBYTES = 1 << 20
"""Largest spec file read: the shipped ones are a few kB."""
PRECISIONS = ("fp32", "fp16", "int8")
"""What a part can run in: float32 as exported, float16 (converted), int8 QDQ (quantized)."""

_NUM = {"type": "number", "exclusiveMinimum": 0}
_NUM0 = {"type": "number", "minimum": 0}
_OPS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}


@dataclass(frozen=True)
class BackendKind:
    """What a device spec must say for one kind of backend (the ``runtime`` key of a backend).

    Attributes:
        requires: Keys a backend entry of this kind must have (TVM needs its ``target``).
        summary: One line for ``edgesplit devices`` and error messages.
        precision: What its parts run in (one of :data:`PRECISIONS`): a processor that runs
            several precisions has one backend per precision (``ort`` and ``ort-int8``), so that
            profiles and plans, keyed by backend, keep them apart.
    """

    requires: tuple[str, ...] = ()
    summary: str = ""
    precision: str = "fp32"


# The backend kinds a spec may name, by ``runtime``: the schema's enum is built from this table.
# A new backend adds one line here and one in each stage's table (profile/backends.py,
# compile/backends.py, runtime/backends.py); nothing else branches on backend names.
BACKENDS: dict[str, BackendKind] = {
    "ort": BackendKind((), "ONNX Runtime with an execution provider"),
    "tvm": BackendKind(("target",), "Apache TVM, compiled for a target"),
    "ort-int8": BackendKind(
        (), "ONNX Runtime on int8 QDQ parts (onnxruntime.quantization)", "int8"
    ),
    "ort-fp16": BackendKind((), "ONNX Runtime on float16 parts (onnxconverter-common)", "fp16"),
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
        "precisions": {
            "type": "array",
            "items": {"enum": list(PRECISIONS)},
            "minItems": 1,
            "uniqueItems": True,
        },
        "cores": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 65535},
            "minItems": 1,
        },
        "threads": {"type": "integer", "minimum": 1, "maximum": 4096},
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
        # core groups: name -> member processors (CPU processors whose cores run one part together)
        "groups": {
            "type": "object",
            "additionalProperties": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 2,
                "uniqueItems": True,
            },
            "propertyNames": {"pattern": "^[A-Za-z0-9_+]+$"},
        },
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
    backend = s["properties"]["processors"]["additionalProperties"]["properties"]["backends"][
        "items"
    ]
    backend["properties"]["runtime"] = {"enum": list(BACKENDS)}
    return s


MAX_DEPTH = 32
"""Deepest nesting a spec may have (the schema's own is 6; ``options`` and ``target`` are
free-form)."""


def check_values(data: Any, path: Path | str) -> None:
    """What the schema cannot say: every number finite (YAML's ``.nan``, ``.inf``, ``1e999``) and
    within a float's range, and nesting at most :data:`MAX_DEPTH` deep. Walks without recursion.

    Raises:
        DeviceSpecError: naming the file and the key.
    """
    stack: list[tuple[Any, tuple, int]] = [(data, (), 0)]
    while stack:
        value, key, depth = stack.pop()
        where = ".".join(map(str, key)) or "(top)"
        if depth > MAX_DEPTH:
            raise DeviceSpecError(f"{path}: {short(where, 120)}: nested more than {MAX_DEPTH} deep")
        if isinstance(value, dict):
            stack.extend((v, (*key, short(k, 40)), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*key, i), depth + 1) for i, v in enumerate(value))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            try:
                finite = math.isfinite(float(value))
            except OverflowError:
                finite = False
            if not finite:
                raise DeviceSpecError(
                    f"{path}: {short(where, 120)}: {short(value, 40)} is not a finite number"
                )


def validate(data: Any, path: Path | str) -> None:
    """Check a spec against the schema; the error names the file and every bad key (up to 5).

    Values quoted in the messages are cut short (a message never holds a whole large value).
    """
    import jsonschema

    check_values(data, path)
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        msgs = []
        for e in errors[:5]:
            key = ".".join(str(k) for k in e.absolute_path) or "(top)"
            msgs.append(f"{short(key, 120)}: {short(e.message, 200)}")
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise DeviceSpecError(f"{path}: " + "; ".join(msgs) + more)


class _SpecLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases (``&a`` / ``*a``).

    A spec has no use for them, and nested aliases make a few hundred bytes expand to gigabytes
    (the "billion laughs"), which every reader of the value, error messages included, would pay.
    """

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "anchors and aliases (& and *) are not allowed in a spec",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def load_yaml(
    path: Path, error: type[Exception], what: str, *, max_nbytes: int = MAX_SPEC_NBYTES
) -> Any:
    """A small YAML file we read settings from (specs, fleet files): at most ``max_nbytes``,
    UTF-8, safe YAML without anchors or aliases, not nested past Python's stack. One-line errors
    naming the file."""
    raw = read_file_bytes(path, error, what, max_nbytes=max_nbytes)
    try:
        return yaml.load(raw.decode("utf-8"), Loader=_SpecLoader)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{path}:{line} not valid YAML ({short(problem, 200)})") from e
    except RecursionError:
        raise error(f"{path}: not valid YAML (nested too deeply)") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not a text file (not UTF-8: {e.reason} at byte {e.start})") from e


def read_yaml(path: Path) -> dict[str, Any]:
    """A spec file as a mapping (see :func:`load_yaml`)."""
    data = load_yaml(path, DeviceSpecError, "device spec")
    if not isinstance(data, dict):
        raise DeviceSpecError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    return data


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
        "precisions": list(p.spec_precisions) if p.spec_precisions is not None else None,
        "cores": list(p.cores) if p.cores is not None else None,
        "threads": p.threads,
        "cpu_quota_pct": p.cpu_quota_pct,
    }
    ops = _ops_json(p.ops_only, p.ops_exclude)
    return {
        **out,
        **({"ops": ops} if ops else {}),
        **{k: v for k, v in optional.items() if v is not None},
    }


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
    out["processors"] = {p.name: _processor_json(p) for p in spec.processors if not p.is_group}
    out["groups"] = {p.name: list(p.members) for p in spec.processors if p.is_group}
    out["links"] = [
        {"between": [a, b], "bandwidth_gbps": gbps, "latency_ms": ms}
        for (a, b), (gbps, ms) in spec.links.items()
    ]
    out["default_link"] = {
        "bandwidth_gbps": spec.default_link[0],
        "latency_ms": spec.default_link[1],
    }
    if spec.servers:
        out["servers"] = list(spec.servers)
    return out
