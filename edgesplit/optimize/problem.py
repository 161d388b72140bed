"""The Problem: everything a plan is made from, resolved and checked.

:mod:`edgesplit.workflows.resolve` builds it from what the user gave (paths, names, flags) and
checks it
once; the optimiser only reads it. It holds loaded objects, never paths to load, so everything in
``optimize/`` stays a pure function of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgesplit.device.spec import DeviceSpec, NetworkLink
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.load import ServerLoad
from edgesplit.profile.store import Profile

if TYPE_CHECKING:
    from edgesplit.optimize.accuracy import AccuracyCheck


@dataclass(frozen=True)
class Problem:
    """A model, where it may run, what it costs there, and what to minimise.

    Invariants (checked by :func:`edgesplit.workflows.resolve.resolve`): ``profile`` is of ``graph``
    (same
    sha256) and has an entry, measured or predicted, for every processor and backend of
    :attr:`full_device` it could have; ``link`` is set exactly when ``server`` is; ``objective`` is
    a key of :data:`~edgesplit.optimize.objectives.OBJECTIVES`.

    Attributes:
        device: The device alone (as its spec names it; its path is recorded in the plan).
        server: The server spec whose processors may take parts, or None.
        profile_path: The profile file the costs came from, when they came from a file.
        server_profile_path: The file of a profile measured on the server, merged into
            ``profile`` (:func:`edgesplit.workflows.resolve.with_server_profile`); a plan records it
            beside
            ``profile_path``, and its problem is made again by merging the two again.
        server_load: Devices sharing the server, to price its queueing delay (None: this one alone).
        accuracy: The budget reduced-precision parts must meet and how to measure it
            (:mod:`edgesplit.optimize.accuracy`); None: no check (plans made in code).
        split_operators: A latency plan may split operators between two processors
            (:mod:`edgesplit.optimize.split`); off by default: on this machine's big and little
            cores such plans measured slower than the big core alone (README, "Split operators").
    """

    graph: ModelGraph
    device: DeviceSpec
    profile: Profile
    server: DeviceSpec | None = None
    link: NetworkLink | None = None
    objective: str = "latency"
    slo_ms: float | None = None
    pins: Mapping[str, str] = field(default_factory=dict)
    profile_path: str | None = None
    server_load: ServerLoad | None = None
    server_profile_path: str | None = None
    accuracy: AccuracyCheck | None = None
    split_operators: bool = False

    @property
    def full_device(self) -> DeviceSpec:
        """The device with the server's processors appended (``<server>.<processor>``)."""
        return combined(self.device, self.server)


def combined(device: DeviceSpec, server: DeviceSpec | None) -> DeviceSpec:
    """``device`` with ``server``'s processors appended, unless it has server processors already."""
    if server is None or any(p.is_remote for p in device.processors):
        return device
    return device.with_server(server)
