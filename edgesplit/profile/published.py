"""Published whole-model latencies of hardware we do not have, and the efficiencies fitted to them.

Two kinds of shipped data, both under the top-level ``profiles/`` folder:

- ``profiles/published/DEVICE.yaml``: figures copied from publications and benchmark results
  (ncnn's benchmark table, Qualcomm AI Hub, MLPerf), each with its source, the exact model,
  precision, runtime and processor. Validated against :data:`PUBLISHED_SCHEMA`.
- ``profiles/fitted/DEVICE.json``: per (processor, precision), the achieved share of the
  spec's peak compute and memory bandwidth and a per-node overhead, fitted to those figures by
  :mod:`edgesplit.profile.fit`. The device YAMLs keep their datasheet figures; this file is the
  only place fitted numbers live, so nobody takes one for the other.

Every read of these files goes through :func:`data_dir`, so pointing it at package data (for an
installed wheel) is a change in one place.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.errors import ProfileError
from edgesplit.util import shipped_dir

PRECISIONS = ("fp32", "fp16", "int8")

PUBLISHED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["device", "sources", "figures"],
    "additionalProperties": False,
    "properties": {
        "device": {"type": "string", "minLength": 1},
        "sources": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "required": ["title", "publisher", "url", "date", "where", "secondary"],
                "additionalProperties": False,
                "properties": {
                    "title": {"type": "string", "minLength": 5},
                    "publisher": {"type": "string", "minLength": 2},
                    "url": {"type": "string", "pattern": "^https://"},
                    "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                    "where": {"type": "string", "minLength": 5},
                    "secondary": {"type": "boolean"},
                    "notes": {"type": "string"},
                },
            },
        },
        "figures": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": [
                    "id",
                    "model",
                    "architecture",
                    "zoo_model",
                    "input_shape",
                    "batch",
                    "precision",
                    "runtime",
                    "processor",
                    "hardware",
                    "threads",
                    "latency_ms",
                    "statistic",
                    "source",
                ],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "model": {"type": "string", "minLength": 1},
                    "architecture": {"type": "string", "minLength": 3},
                    "zoo_model": {"type": ["string", "null"]},
                    "input_shape": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 1},
                        "minItems": 2,
                    },
                    "batch": {"const": 1},
                    "precision": {"enum": list(PRECISIONS)},
                    "runtime": {"type": "string", "minLength": 3},
                    "processor": {"type": "string", "minLength": 1},
                    "hardware": {"type": "string", "minLength": 3},
                    "threads": {"type": ["integer", "null"], "minimum": 1},
                    "latency_ms": {"type": "number", "exclusiveMinimum": 0},
                    "statistic": {"type": "string", "minLength": 3},
                    "source": {"type": "string", "minLength": 1},
                    "perf_yaml": {"type": "string"},
                    "notes": {"type": "string"},
                },
            },
        },
    },
}


def data_dir() -> Path:
    """The ``profiles/`` folder that holds published figures and fitted calibrations.

    ``EDGESPLIT_PROFILES_DIR`` overrides it; otherwise the shipped ``profiles/``: the top-level
    folder in a checkout, the copy in an installed wheel (:func:`edgesplit.util.shipped_dir`).
    """
    env = os.environ.get("EDGESPLIT_PROFILES_DIR")
    return Path(env) if env else shipped_dir("profiles")


@dataclass(frozen=True)
class PublishedFigure:
    """One published whole-model latency at batch 1 (fields as in :data:`PUBLISHED_SCHEMA`)."""

    id: str
    model: str
    architecture: str
    zoo_model: str | None
    input_shape: tuple[int, ...]
    precision: str
    runtime: str
    processor: str
    hardware: str
    threads: int | None
    latency_ms: float
    statistic: str
    source: str


@dataclass(frozen=True)
class PublishedSet:
    """The published figures of one device spec, with their sources (key -> fields)."""

    device: str
    path: str
    sources: dict[str, dict[str, Any]]
    figures: tuple[PublishedFigure, ...]


def _validate(data: Any, path: Path) -> None:
    import jsonschema

    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top")
    errors = sorted(
        jsonschema.Draft202012Validator(PUBLISHED_SCHEMA).iter_errors(data),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    msgs = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors[:5]]
    if not errors:
        ids = [f["id"] for f in data["figures"]]
        msgs += [
            f"figures: id '{i}' is used twice" for i in sorted({i for i in ids if ids.count(i) > 1})
        ]
        msgs += [
            f"figures.{i}.source: '{f['source']}' is not in sources"
            for i, f in enumerate(data["figures"])
            if f["source"] not in data["sources"]
        ]
    if msgs:
        raise ProfileError(
            f"{path}: "
            + "; ".join(msgs[:5])
            + (f" (+{len(msgs) - 5} more)" if len(msgs) > 5 else "")
        )


def published_devices() -> list[str]:
    """Names of the device specs with a published-figures file."""
    return sorted(p.stem for p in (data_dir() / "published").glob("*.yaml"))


def load_published(device_or_path: str | os.PathLike) -> PublishedSet:
    """Read and validate the published figures of a device (a spec name or a file path).

    Raises:
        ProfileError: naming the file and every bad key (up to five).
    """
    import yaml

    p = Path(device_or_path)
    path = (
        p if p.suffix in (".yaml", ".yml") else data_dir() / "published" / f"{device_or_path}.yaml"
    )
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no published figures for this device") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ProfileError(f"{path}: not a readable YAML file ({e})") from e
    _validate(data, path)
    figures = tuple(
        PublishedFigure(
            **{
                k: v
                for k, v in f.items()
                if k not in ("batch", "perf_yaml", "notes", "input_shape")
            },
            input_shape=tuple(f["input_shape"]),
        )
        for f in data["figures"]
    )
    return PublishedSet(data["device"], str(path), data["sources"], figures)


@dataclass(frozen=True)
class ProcessorFit:
    """Fitted efficiencies of one processor at one precision.

    Attributes:
        processor: Processor name in the device spec.
        precision: ``fp32`` / ``fp16`` / ``int8``: what the published runs used.
        compute_efficiency: Achieved share of the spec's ``peak_gflops`` on dense Conv/Gemm (the
            spec's peak is its fp32 figure, so fp16/int8 shares can exceed 1). Other op classes
            keep the plain roofline's ratio to Conv (depthwise and elementwise ops are slower).
        memory_efficiency: Achieved share of the spec's ``mem_bandwidth_gbps`` (above 1 where
            activations stay in cache).
        overhead_ms: Fixed cost per graph node (dispatch; runtimes fuse some nodes away).
        call_ms: Fixed cost of one call into the processor's runtime (a part's dispatch).
        figures: Ids of the published figures the fit used.
    """

    processor: str
    precision: str
    compute_efficiency: float
    memory_efficiency: float
    overhead_ms: float
    call_ms: float = 0.0
    figures: tuple[str, ...] = ()


@dataclass(frozen=True)
class PublishedFits:
    """All fitted entries of one device spec, with the fit's date and inputs."""

    device: str
    fitted: str
    source_file: str
    entries: tuple[ProcessorFit, ...]

    def lookup(self, processor: str, precision: str) -> ProcessorFit | None:
        for e in self.entries:
            if e.processor == processor and e.precision == precision:
                return e
        return None


def fit_path(device: str) -> Path:
    return data_dir() / "fitted" / f"{device}.json"


@functools.lru_cache(maxsize=32)
def _load_fits_cached(path: str, mtime_ns: int) -> PublishedFits:
    from edgesplit.util import read_json_object

    data = read_json_object(path, ProfileError, "calibration")
    try:
        entries = tuple(
            ProcessorFit(
                processor=e["processor"],
                precision=e["precision"],
                compute_efficiency=float(e["compute_efficiency"]),
                memory_efficiency=float(e["memory_efficiency"]),
                overhead_ms=float(e["overhead_ms"]),
                call_ms=float(e.get("call_ms", 0.0)),
                figures=tuple(e.get("figures", ())),
            )
            for e in data["entries"]
        )
        return PublishedFits(data["device"], data["fitted"], data["published_file"], entries)
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"{path}: not a calibration file (bad or missing {e})") from e


def load_fits(device: str, path: str | os.PathLike | None = None) -> PublishedFits | None:
    """The fitted calibration of a device spec, or None when it has none."""
    p = Path(path) if path is not None else fit_path(device)
    try:
        mtime = p.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    return _load_fits_cached(str(p), mtime)
