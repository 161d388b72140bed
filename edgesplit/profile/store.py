"""The Profile: per-node cost on each processor and backend, and its JSON file format."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from edgesplit.errors import ProfileError
from edgesplit.util import atomic_write_text, read_json_object

FORMAT_VERSION = 1

MEASURED = "measured"
PREDICTED = "predicted"


@dataclass(frozen=True)
class NodeCost:
    """Cost of one node on one processor/backend.

    Attributes:
        latency_ms: Median latency.
        p90_ms: 90th percentile latency (equal to the median when predicted).
        source: ``measured`` or ``predicted``.
        energy_mj: Energy per run where known (measured from power rails, or modelled).
        runs: How many timed runs the median is over (0 when predicted).
    """

    latency_ms: float
    p90_ms: float
    source: str = MEASURED
    energy_mj: float | None = None
    runs: int = 0


@dataclass(frozen=True)
class ProcessorProfile:
    """All node costs of one (processor, backend) pair.

    Attributes:
        nodes: node name -> cost. A node absent here cannot run on this pair (see ``unsupported``).
        unsupported: node name -> why it cannot run here (op support, import failure ...).
        whole_model_ms: Measured median latency of the whole model on this pair, when it could run
            as a whole; the sum of parts is calibrated against it.
        note: Why the backend could not measure, where it could not (e.g. a TVM import failure).
        dispatch_ms: Measured cost of handing one part to this processor's runtime worker and
            back (a thread round trip plus a trivial run), which every extra part pays.
    """

    processor: str
    backend: str
    source: str
    nodes: Mapping[str, NodeCost]
    unsupported: Mapping[str, str] = field(default_factory=dict)
    whole_model_ms: float | None = None
    whole_model_p90_ms: float | None = None
    note: str = ""
    elapsed_s: float = 0.0
    dispatch_ms: float | None = None

    @property
    def key(self) -> str:
        return f"{self.processor}/{self.backend}"

    @property
    def sum_ms(self) -> float:
        return sum(c.latency_ms for c in self.nodes.values())


@dataclass(frozen=True)
class Profile:
    """Costs of one model on one device.

    Invariants: ``model_sha256`` is the sha256 of the model file the profile was made from; every
    entry covers the nodes of that model by their ModelGraph names.
    """

    model_sha256: str
    model_name: str
    device: str
    input_shapes: Mapping[str, tuple[int, ...]]
    entries: tuple[ProcessorProfile, ...]
    energy: str = "modelled"  # "measured" where power rails were sampled
    versions: Mapping[str, str] = field(default_factory=dict)
    host: str = ""
    created: str = ""
    format_version: int = FORMAT_VERSION

    def entry(self, processor: str, backend: str) -> ProcessorProfile | None:
        for e in self.entries:
            if e.processor == processor and e.backend == backend:
                return e
        return None

    def for_processor(self, processor: str) -> list[ProcessorProfile]:
        return [e for e in self.entries if e.processor == processor]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        return d

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile atomically (temp file in the same folder, then rename)."""
        atomic_write_text(path, json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")

    @staticmethod
    def from_json(d: Mapping[str, Any], source: str = "<profile>") -> Profile:
        try:
            if d.get("format_version") != FORMAT_VERSION:
                raise ProfileError(
                    f"{source}: profile format version {d.get('format_version')!r}, expected {FORMAT_VERSION}"
                )
            entries = tuple(
                ProcessorProfile(
                    processor=e["processor"],
                    backend=e["backend"],
                    source=e["source"],
                    nodes={k: NodeCost(**v) for k, v in e["nodes"].items()},
                    unsupported=dict(e.get("unsupported", {})),
                    whole_model_ms=e.get("whole_model_ms"),
                    whole_model_p90_ms=e.get("whole_model_p90_ms"),
                    note=e.get("note", ""),
                    elapsed_s=e.get("elapsed_s", 0.0),
                    dispatch_ms=e.get("dispatch_ms"),
                )
                for e in d["entries"]
            )
            return Profile(
                model_sha256=d["model_sha256"],
                model_name=d["model_name"],
                device=d["device"],
                input_shapes={k: tuple(v) for k, v in d["input_shapes"].items()},
                entries=entries,
                energy=d.get("energy", "modelled"),
                versions=dict(d.get("versions", {})),
                host=d.get("host", ""),
                created=d.get("created", ""),
            )
        except ProfileError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ProfileError(f"{source}: not a valid profile ({type(e).__name__}: {e})") from e


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile JSON file.

    Raises:
        ProfileError: naming the file, when it is missing, not JSON, or not a profile.
    """
    return Profile.from_json(read_json_object(path, ProfileError, "profile"), str(path))
