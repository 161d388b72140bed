"""A server shared by many devices: server parts priced with the queueing delay of N devices' load.

The model (``partition --server-load N``): N identical devices run the plan in a closed loop, each
sending its next request when its last one is done. The server computes ``slots`` requests at
once. A request's time at the server is its service time ``S`` (the server nodes' profiled
latency) plus the time it waits behind the other devices' requests, found by exact mean value
analysis (MVA) of the closed network: the server a queueing station, the rest of the request
(device compute, transfers, ``Z``) a delay. ``slots > 1`` uses Seidmann's approximation: a queue
with service ``S / slots`` plus a delay of ``S (slots - 1) / slots``. For N = 1 the time is ``S``;
as N grows it tends to ``N S / slots - Z``, the server's saturation.

The factor ``(time at the server) / S`` depends on the plan (``S`` and ``Z`` do), so
:func:`loaded_costs` iterates: solve with server nodes scaled by the factor, measure ``S`` and
``Z`` of that plan, recompute the factor, and solve again. The factor only grows from one round to
the next (the larger of the two is kept), so it ends; the plans it prices are conservative.
A crowded server thus makes server nodes dearer, and the cut moves toward the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.optimize.costs import CostModel

MAX_ROUNDS = 8
TOLERANCE = 0.01  # stop when the factor moves by less than this (relative)


@dataclass(frozen=True)
class ServerLoad:
    """How crowded the server is: ``devices`` running the plan at once, ``slots`` computed at
    once."""

    devices: int
    slots: int = 1

    def check(self) -> None:
        if self.devices < 1 or self.slots < 1:
            raise PlanError(
                f"--server-load must be at least 1 device and 1 slot (got {self.devices}, "
                f"{self.slots})"
            )


@dataclass(frozen=True)
class LoadedCosts:
    """Costs with the server nodes scaled by ``factor`` (time at the server / service time).

    ``costs`` is the object the last round solved, when the rounds ended by converging."""

    costs: CostModel
    factor: float
    service_ms: float
    rounds: int


def server_time_ms(service_ms: float, think_ms: float, load: ServerLoad) -> float:
    """Mean time one request spends at the server (waiting and computing), by MVA (see module
    doc)."""
    if service_ms <= 0:
        return 0.0
    queue_ms = service_ms / load.slots
    delay_ms = service_ms - queue_ms
    think_ms = max(0.0, think_ms) + delay_ms
    waiting = 0.0  # mean requests at the queue
    residence = queue_ms
    for n in range(1, load.devices + 1):
        residence = queue_ms * (1.0 + waiting)
        waiting = n * residence / (residence + think_ms)
    return residence + delay_ms


def scaled(cm: CostModel, factor: float) -> CostModel:
    """``cm`` with every server node's latency times ``factor``."""
    ms = np.where(cm.remote[None, :], cm.node_ms * factor, cm.node_ms)
    return replace(cm, node_ms=ms)


def loaded_costs(
    cm: CostModel, solve: Callable[[CostModel], tuple[np.ndarray, float]], load: ServerLoad
) -> LoadedCosts:
    """Costs priced for ``load``; ``solve(costs)`` gives an assignment and its latency in ms.

    Pure: ``solve`` is the solver of the objective at hand, run once per round (at most
    :data:`MAX_ROUNDS`).
    """
    load.check()
    factor, service_ms, rounds = 1.0, 0.0, 0
    costs = cm
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 - the count is returned
        assign, latency_ms = solve(costs)
        on_server = cm.remote[assign]
        service_ms = float(cm.node_ms[np.arange(cm.n_nodes), assign][on_server].sum())
        if service_ms <= 0 or load.devices == 1:
            break
        think_ms = latency_ms - service_ms * factor
        new = server_time_ms(service_ms, think_ms, load) / service_ms
        if new <= factor * (1 + TOLERANCE):
            break
        factor = new
        costs = scaled(cm, factor)
    # ``costs`` is what ``solve`` saw last, unless the rounds ran out first
    return LoadedCosts(costs, factor, service_ms, rounds)
