"""The Profile: per-node cost on each processor and backend, and its JSON file format."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from edgesplit.errors import ProfileError
from edgesplit.util import (
    check_fields,
    check_number,
    known_fields,
    read_json_object,
    reading_record,
    short,
    write_json,
)

FORMAT_VERSION = 1

MEASURED = "measured"
PREDICTED = "predicted"
MODELLED = "modelled"


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> NodeCost:
        return NodeCost(**known_fields(NodeCost, d))


@dataclass(frozen=True)
class RunTerms:
    """What running a part on one (processor, backend) pair costs beyond its nodes' kernels.

    Measured by the profiler on the device itself (:mod:`edgesplit.profile.terms`), never set in
    code; ``edgesplit refit`` refits some of them from a bundle's measured part runs. MB is
    10^6 bytes. The cost model (:mod:`edgesplit.optimize.costs`) states how each term is charged.

    Attributes:
        part_fixed_ms: One part run beyond its kernels: the backend's run call, binding its inputs,
            allocating and collecting its outputs (a 1-node part's run minus its kernel time).
        input_ms_per_mb, output_ms_per_mb: Per MB of a tensor entering or leaving a part (a copy
            into the backend, or out of it into numpy).
        reorder_ms_per_mb: A layout reorder (ORT's NCHWc ``ReorderInput``/``ReorderOutput``) per MB,
            from a Conv micro-model whose input and output cross a part boundary; None when the
            backend adds none.
        reorder_in_ms, reorder_out_ms: Per blocked tensor, one reorder of it into the blocked layout
            (where a blocked reader's part starts) and out of it (where its producer's part ends),
            measured on a micro-model of the model's own blocked shapes; a tensor absent here is
            priced by ``reorder_ms_per_mb``.
        blocked_tensors: Tensors the backend holds in a blocked layout inside the whole model: one
            leaving a part is reordered there.
        blocked_readers: Nodes that read their inputs in that layout: a tensor entering their part
            is reordered there.
        handoff_idle_ms, handoff_ms: The hand-off of a part to this processor's worker thread, after
            the worker was idle for each of the gaps (medians; a thread wake-up grows with the idle
            gap).
        return_ms: The caller's wake-up when a request ends, after it waited each of the same gaps.
        session_ms: Per request, the rest of the Session's own work (inputs checked, bookkeeping).
        solo_session_ms: The same for a bundle of one local part, which the Session runs on the
            caller's thread and checks after the run (None, in older profiles: ``session_ms``).
        stream_gap_ms: In a stream, from one part's outputs collected to the start of the next part
            already queued on this worker, as ``calibrate`` measured it; None (as profiled): the
            hand-off at zero idle gap stands for it.
        contention: Slowdown factor of this pair while processor X runs a whole model of its own
            (measured pairwise; 1.0 is none).
        remote_call_ms, remote_call_ms_per_mb: On the device's home entry: what one call of a part
            on a server costs beyond the link's modelled time and the part's compute there (this
            client and the server's HTTP handling: encoding, the request, decoding), per call and
            per MB sent or received. Fitted by ``calibrate --server`` from calls measured against
            the server; 0 until then (the profiler has no server to call).
        node_scale: A correction on node costs, fitted by ``calibrate`` (1.0 as measured).
        crossing_ms: Per tensor entering a part here, a correction fitted by ``calibrate``.
        calibrated: What ``calibrate`` fitted these on (empty as measured).
        calibrated_from: The measured values of the terms ``calibrate`` replaced (to start again
            from them: calibration never compounds).
    """

    part_fixed_ms: float = 0.0
    input_ms_per_mb: float = 0.0
    output_ms_per_mb: float = 0.0
    reorder_ms_per_mb: float | None = None
    reorder_in_ms: Mapping[str, float] = field(default_factory=dict)
    reorder_out_ms: Mapping[str, float] = field(default_factory=dict)
    blocked_tensors: tuple[str, ...] = ()
    blocked_readers: tuple[str, ...] = ()
    handoff_idle_ms: tuple[float, ...] = ()
    handoff_ms: tuple[float, ...] = ()
    return_ms: tuple[float, ...] = ()
    session_ms: float = 0.0
    solo_session_ms: float | None = None
    contention: Mapping[str, float] = field(default_factory=dict)
    stream_gap_ms: float | None = None
    node_scale: float = 1.0
    crossing_ms: float = 0.0
    remote_call_ms: float = 0.0
    remote_call_ms_per_mb: float = 0.0
    calibrated: str = ""
    calibrated_from: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RunTerms:
        kw = known_fields(RunTerms, d)
        for key in (
            "blocked_tensors",
            "blocked_readers",
            "handoff_idle_ms",
            "handoff_ms",
            "return_ms",
        ):
            if key in kw:
                kw[key] = tuple(kw[key])
        for key in ("contention", "reorder_in_ms", "reorder_out_ms"):
            value = d.get(key, {})  # anything but an object is left for check_fields to name
            kw[key] = {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else value
        kw["calibrated_from"] = dict(d.get("calibrated_from", {}))
        return RunTerms(**kw)


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
        energy: ``measured`` when the node energies come from power rails sampled over this
            pair's runs, else ``modelled`` (active power from the spec x latency).
        terms: What a part run costs here beyond its kernels (None where not measured: predicted
            entries, older profiles; then ``dispatch_ms`` is the per-part cost).
        edge_in_ms_per_mb, edge_out_ms_per_mb: For a reduced-precision pair, converting a tensor
            that enters one of its parts into the part's precision (QuantizeLinear, a cast), and
            back when it leaves, per MB of float32: measured micro-models; None for fp32 pairs.
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
    energy: str = MODELLED
    terms: RunTerms | None = None
    edge_in_ms_per_mb: float | None = None
    edge_out_ms_per_mb: float | None = None

    @property
    def key(self) -> str:
        return f"{self.processor}/{self.backend}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ProcessorProfile:
        """One entry of a profile (the one reader: profile files, the agent's checkpoints).

        Raises:
            KeyError, TypeError, AttributeError, ValueError: for a malformed entry; callers name the
            file.
        """
        kw = known_fields(ProcessorProfile, d)
        kw["nodes"] = {k: NodeCost.from_json(v) for k, v in d["nodes"].items()}
        kw["unsupported"] = dict(d.get("unsupported", {}))
        if d.get("terms") is not None:
            kw["terms"] = RunTerms.from_json(d["terms"])
        return ProcessorProfile(**kw)

    @property
    def sum_ms(self) -> float:
        return sum(c.latency_ms for c in self.nodes.values())


@dataclass(frozen=True)
class Profile:
    """Costs of one model on one device.

    Invariants: ``model_sha256`` is the sha256 of the model file the profile was made from; every
    entry covers the nodes of that model by their ModelGraph names.

    ``emulated`` is empty for a profile measured on the hardware itself; otherwise it says why the
    timings are not the device's (e.g. an aarch64 board emulated by qemu on an x86 CPU).
    ``calibration`` records what ``edgesplit refit`` fitted (bundle, rounds, errors before and
    after); empty when measured.
    """

    model_sha256: str
    model_name: str
    device: str
    input_shapes: Mapping[str, tuple[int, ...]]
    entries: tuple[ProcessorProfile, ...]
    energy: str = MODELLED  # "measured" where power rails were sampled
    versions: Mapping[str, str] = field(default_factory=dict)
    host: str = ""
    created: str = ""
    emulated: str = ""
    calibration: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def entry(self, processor: str, backend: str) -> ProcessorProfile | None:
        return next((e for e in self.entries if e.key == f"{processor}/{backend}"), None)

    def for_processor(self, processor: str) -> list[ProcessorProfile]:
        return [e for e in self.entries if e.processor == processor]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        d["entries"] = [e.to_json() for e in self.entries]
        return d

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile atomically (temp file in the same folder, then rename)."""
        write_json(path, self.to_json(), "profile")

    @staticmethod
    def from_json(d: Mapping[str, Any], source: str = "<profile>") -> Profile:
        with reading_record(d, source, "profile", ProfileError, format_version=FORMAT_VERSION):
            kw = known_fields(Profile, d)
            kw["input_shapes"] = {k: tuple(v) for k, v in d["input_shapes"].items()}
            kw["entries"] = tuple(ProcessorProfile.from_json(e) for e in d["entries"])
            kw["versions"] = dict(d.get("versions", {}))
            kw["calibration"] = dict(d.get("calibration", {}))
            prof = Profile(**kw)
        check_profile(prof, source)
        return prof


def check_profile(prof: Profile, source: str) -> None:
    """Every field of a profile read from a file has its type, every number is finite and not
    negative, and every backend is registered.

    The typed checks come from the dataclasses' annotations (:func:`edgesplit.util.check_fields`),
    so a field added to :class:`NodeCost`, :class:`ProcessorProfile` or :class:`Profile` is checked
    with no code here; a field that may be negative goes in ``signed=``.

    Raises:
        ProfileError: naming ``source``, the entry, the node and the field.
    """
    from edgesplit.device.schema import BACKENDS

    check_fields(prof, source, ProfileError)
    for name, shape in prof.input_shapes.items():
        if not isinstance(shape, tuple):
            raise ProfileError(
                f"{source}: input_shapes.{short(name, 40)}: expected a list of sizes"
            )
        for dim in shape:
            check_number(
                dim, f"{source}: input_shapes.{short(name, 40)}", ProfileError, integer=True
            )
    for i, e in enumerate(prof.entries):
        where = f"{source}: entries[{i}]"
        check_fields(e, where, ProfileError)
        if e.backend not in BACKENDS:
            raise ProfileError(
                f"{where}: unknown backend {short(e.backend, 40)} (backends: {', '.join(BACKENDS)})"
            )
        for node, cost in e.nodes.items():
            if not isinstance(cost, NodeCost):
                raise ProfileError(f"{where} ({e.key}): node {short(node, 60)}: expected an object")
            check_fields(cost, f"{where} ({e.key}): node {short(node, 60)}", ProfileError)
        if e.terms is not None:
            check_fields(e.terms, f"{where} ({e.key}): terms", ProfileError)


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile JSON file.

    Raises:
        ProfileError: naming the file, when it is missing, not JSON, or not a profile.
    """
    return Profile.from_json(read_json_object(path, ProfileError, "profile"), str(path))
