"""The cost model: what each node costs on each processor and what each crossing tensor costs.

Built from a :class:`~edgesplit.profile.store.Profile` and a
:class:`~edgesplit.device.spec.DeviceSpec`
(the server's processors appended with ``with_server``), plus a network link when a server is in
play. Everything the solvers need is in plain numpy arrays indexed by node (``n``) and processor
(``p``); the solvers never look at the profile, the device or the ONNX model again.

The model, stated once (every solver, baseline and plan is priced by it):

* **Nodes.** For each (node, processor) the fastest backend whose profile entry has the node is
  used; the plan records that backend. An entry that has ``whole_model_ms`` and covers every node
  is calibrated: its node latencies are scaled so that the whole model as one part costs
  ``whole_model_ms`` with the per-part terms below (:func:`~edgesplit.optimize.overheads.
  whole_model_scale`), which spreads the per-kernel overhead (or fusion gain) the per-node figures
  miss; ``calibrate``'s ``node_scale`` multiplies it. Active energy is the
  entry's ``energy_mj`` (scaled alike) or ``active_w x latency``. A node missing from every entry of
  a processor cannot run there.
* **Transfers.** A tensor produced on ``p`` and read on ``q != p`` crosses once per destination
  processor, however many nodes read it there. On-chip copies cost ``latency_ms + nbytes /
  bandwidth`` (``bandwidth_gbps`` is in GB/s, like ``mem_bandwidth_gbps``). Device -> server costs
  ``nbytes * 8 / up_mbps`` plus ``rtt_ms / 2`` (one-way propagation); server -> device uses
  ``down_mbps``. Radio energy is ``tx_power_w`` (``rx_power_w``) times the serialisation time; the
  propagation half-RTT is spent waiting, at idle power. A tensor entering a processor whose parts
  run in reduced precision is converted there (quantized), and back when it leaves (dequantized):
  the measured ``edge_in_ms_per_mb`` / ``edge_out_ms_per_mb`` per byte (0 where the processor
  also has an fp32 entry, whose parts convert nothing).
* **Parts, hand-offs, requests.** What the runtime pays beyond nodes and crossings (a fixed cost
  per part run, bytes in and out of parts, layout reorders at part boundaries, the hand-off to an
  idle worker, the Session's per-request work, contention between processors) is in
  ``overheads`` (:mod:`edgesplit.optimize.overheads`), priced by the part-level schedule
  (:mod:`edgesplit.optimize.schedule`). Node costs are calibrated net of them. The sequential forms
  the exact solvers minimise cannot see parts: there a crossing onto another local processor pays
  the fixed cost of the part it starts (:meth:`CostModel.linear`).
* **Idle power.** While the device waits (for another processor, a copy, the network or the
  server) each of its processors that is not running draws ``idle_w``: device energy is
  ``active + radio + sum_p idle_w[p] * (T - busy_p)`` over the local processors, with ``T`` the
  end-to-end latency. Server processors cost no device energy; their energy is not the device's.
* **Graph inputs** start on the *home* processor (the first local processor of kind ``cpu``, else
  the first local one) and **graph outputs** must end there, so a remote output is downloaded.
* **Memory** (a documented upper bound, linear so the MILP can use it): a processor holds the
  weights of its nodes, every activation its nodes write and every tensor it receives, as if
  nothing were freed. It is checked against ``Processor.memory_mb`` and, summed over a side, against
  the device's (and the server's) ``memory_mb``; MB is 10^6 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from edgesplit.device.spec import DeviceSpec, NetworkLink, Processor, shares_cores
from edgesplit.errors import PlanError
from edgesplit.model.graph import ModelGraph
from edgesplit.model.pieces import piece_layout
from edgesplit.optimize.overheads import Overheads, build_overheads, none, whole_model_scale
from edgesplit.profile.store import Profile

MB = 1e6


@dataclass(frozen=True)
class Flow:
    """A tensor that may cross processors: produced by node ``src`` (-1: a graph input, at home),
    read by nodes ``dsts``; ``to_home`` when it is a graph output (it must reach home)."""

    tensor: str
    nbytes: int
    src: int
    dsts: tuple[int, ...]
    to_home: bool = False


@dataclass(frozen=True, eq=False)
class CostModel:
    """Costs of one model on the processors of a device (and server), as arrays.

    Attributes:
        nodes: Node names in topological order.
        op_types: Op type per node.
        processors: Processor names (device first, then ``<server>.<proc>``).
        kinds: Processor kind per processor (cpu, gpu, npu, dsp).
        remote: True for server processors.
        home: Index of the processor where graph inputs start and outputs end.
        node_ms: ``(N, P)`` latency; ``inf`` where the node cannot run.
        node_mj: ``(N, P)`` active device energy (0 on server processors).
        backend: ``backend[n][p]``: the backend key used for node n on processor p (or None).
        allowed: ``(N, P)``: support and pins together.
        flows: Tensors that may cross processors.
        link_ms: ``(P, P)`` fixed latency per crossing (on-chip copy latency, or half the RTT).
        link_ms_per_byte: ``(P, P)`` serialisation time per byte.
        radio_w: ``(P, P)`` radio power while serialising (0 on chip).
        channel: ``(P, P)`` id of the channel a crossing occupies (uplink, downlink, a chip link).
        idle_w: ``(P,)`` idle power of device processors (0 for server processors).
        mem_nbytes: ``(N,)`` weights plus activations written by each node.
        mem_limit_nbytes: ``(P,)`` per-processor limit (``inf`` where none).
        group_limits: ``(processor indices, limit_nbytes)`` for limits shared by several processors.
        overheads: The part, hand-off and request terms (None: none, as in a model made in code).
        shared_cores: ``(P, P)`` True where two local processors run on a core in common (a core
            group and its members; the diagonal too): they never run parts at once, and a group's
            time counts as busy time of each member (None: only the diagonal).
        piece_of: Per node, the piece of a split operator it is in (-1: none), and ``joins``, the
            nodes that join pieces (:func:`edgesplit.model.pieces.piece_layout`): parts keep them
            apart (:mod:`edgesplit.optimize.parts`).
    """

    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    processors: tuple[str, ...]
    kinds: tuple[str, ...]
    remote: np.ndarray
    home: int
    node_ms: np.ndarray
    node_mj: np.ndarray
    backend: tuple[tuple[str | None, ...], ...]
    allowed: np.ndarray
    flows: tuple[Flow, ...]
    link_ms: np.ndarray
    link_ms_per_byte: np.ndarray
    radio_w: np.ndarray
    channel: np.ndarray
    idle_w: np.ndarray
    mem_nbytes: np.ndarray
    mem_limit_nbytes: np.ndarray
    group_limits: tuple[tuple[tuple[int, ...], float], ...] = ()
    pins: Mapping[str, str] = field(default_factory=dict)
    overheads: Overheads | None = None
    shared_cores: np.ndarray | None = None
    is_group: np.ndarray | None = None
    piece_of: tuple[int, ...] = ()
    joins: frozenset[int] = frozenset()

    @cached_property
    def groups(self) -> np.ndarray:
        """``(P,)`` bool: core groups (see ``shared_cores``)."""
        return self.is_group if self.is_group is not None else np.zeros(self.n_procs, dtype=bool)

    @cached_property
    def blocks(self) -> np.ndarray:
        """``(P, P)`` bool: processors that cannot run at once (see ``shared_cores``)."""
        if self.shared_cores is not None:
            return self.shared_cores
        return np.eye(self.n_procs, dtype=bool)

    @cached_property
    def blocked_by(self) -> tuple[tuple[int, ...], ...]:
        """Per processor, the processors a part on it keeps waiting (itself first)."""
        return tuple(
            (p, *(q for q in np.flatnonzero(self.blocks[p]).tolist() if q != p))
            for p in range(self.n_procs)
        )

    def core_busy_ms(self, busy_ms: np.ndarray) -> np.ndarray:
        """Per processor, the time it (or a processor it shares cores with) is busy, from each
        processor's own busy time: a core group's runs keep its members busy and the reverse."""
        return self.blocks.astype(float) @ np.asarray(busy_ms, dtype=float)

    @cached_property
    def ov(self) -> Overheads:
        """The overheads, zeros where the model has none."""
        if self.overheads is not None:
            return self.overheads
        return none(self.n_nodes, self.n_procs, len(self.flows))

    @cached_property
    def node_edges(self) -> tuple[tuple[int, int], ...]:
        """The data edges ``(src, dst)`` between nodes, unique and sorted."""
        return tuple(sorted({(f.src, d) for f in self.flows if f.src >= 0 for d in f.dsts}))

    @cached_property
    def flow_reads(self) -> tuple[tuple[int, int, int], ...]:
        """``(flow index, its source node or -1, a node that reads it)``, once per read."""
        return tuple((i, f.src, d) for i, f in enumerate(self.flows) for d in f.dsts)

    @cached_property
    def site_codes(self) -> np.ndarray:
        """``site_codes[n, p]``: an integer per (processor, backend) node ``n`` runs on when on
        processor ``p`` (equal exactly where processor and backend are): the parts' key."""
        keys: dict[tuple[int, str | None], int] = {}
        codes = [
            [keys.setdefault((p, b), len(keys)) for p, b in enumerate(row)] for row in self.backend
        ]
        return np.array(codes, dtype=np.int64).reshape(self.n_nodes, self.n_procs)

    @cached_property
    def node_preds(self) -> tuple[tuple[int, ...], ...]:
        """Per node, the nodes it reads from (ascending)."""
        preds: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for a, b in self.node_edges:
            preds[b].append(a)
        return tuple(tuple(p) for p in preds)

    @cached_property
    def seq_link(self) -> tuple[np.ndarray, np.ndarray]:
        """``(latency, ms per byte)`` of a crossing in the sequential forms: the link plus, onto
        another local processor, the fixed cost of the part it starts there (see module doc)."""
        alpha, beta = self.ov.sequential_extra(self.remote)
        return self.link_ms + alpha, self.link_ms_per_byte + beta

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_procs(self) -> int:
        return len(self.processors)

    @property
    def idle_total_w(self) -> float:
        return float(self.idle_w.sum())

    def proc_index(self, name: str) -> int:
        try:
            return self.processors.index(name)
        except ValueError:
            raise PlanError(
                f"unknown processor '{name}' (processors: {', '.join(self.processors)})"
            ) from None

    def xfer_ms(self, p: int, q: int, nbytes: float) -> float:
        """Latency of one crossing of ``nbytes`` from processor p to q (0 when p == q)."""
        if p == q:
            return 0.0
        return float(self.link_ms[p, q] + nbytes * self.link_ms_per_byte[p, q])

    def linear(self, form: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A sequential cost form (``latency``, ``energy`` or ``mix:W``) as ``(a, alpha, beta)``.

        These forms are what the exact solvers minimise; the objectives a plan is made for are
        :mod:`edgesplit.optimize.objectives`, which use them.

        Cost of an assignment ``x`` is ``sum_n a[n, x_n]`` plus, for each flow and each destination
        processor ``q != src``, ``alpha[src, q] + nbytes * beta[src, q]``. ``latency`` sums every
        node and crossing (nothing overlaps); ``energy`` is device energy over that duration;
        ``mix:W`` is ``energy + W * latency``. Crossings cost :attr:`seq_link`.
        """
        ms = np.where(self.allowed, self.node_ms, np.inf)
        if form.startswith("mix:"):
            # energy + w * latency (w in W = mJ/ms): one point of the latency-energy trade-off
            w = float(form[4:])
            forms = [self.linear("energy"), self.linear("latency")]
            return tuple(e + w * lt for e, lt in zip(*forms, strict=True))  # type: ignore[return-value]
        link_ms, per_byte = self.seq_link
        if form == "latency":
            return ms, link_ms.copy(), per_byte.copy()
        if form != "energy":
            raise ValueError(f"no linear form '{form}'")
        idle = self.idle_total_w
        # while a node runs on p, p and the processors it shares cores with are not idle
        busy_idle_w = self.blocks.astype(float) @ self.idle_w
        a = np.where(
            self.allowed, self.node_mj + self.node_ms * (idle - busy_idle_w[None, :]), np.inf
        )
        alpha = link_ms * idle
        beta = per_byte * idle + self.link_ms_per_byte * self.radio_w
        return a, alpha, beta

    def destinations(self, flow: Flow, assign: np.ndarray) -> set[int]:
        dst = {int(assign[c]) for c in flow.dsts}
        if flow.to_home:
            dst.add(self.home)
        return dst

    def src_proc(self, flow: Flow, assign: np.ndarray) -> int:
        return self.home if flow.src < 0 else int(assign[flow.src])


def home_processor(device: DeviceSpec) -> int:
    """Where graph inputs start: the first local processor of kind cpu, else the first local one."""
    local = [i for i, p in enumerate(device.processors) if not p.is_remote]
    if not local:
        raise PlanError(f"device '{device.name}' has no local processor")
    return next((i for i in local if device.processors[i].kind == "cpu"), local[0])


def _node_costs(
    graph: ModelGraph,
    profile: Profile,
    procs: tuple[Processor, ...],
    forced: Mapping[str, Mapping[str, str]] | None = None,
    uniform: Mapping[str, str] | None = None,
):
    n_nodes, n_procs = len(graph.nodes), len(procs)
    ms = np.full((n_nodes, n_procs), np.inf)
    mj = np.zeros((n_nodes, n_procs))
    backend: list[list[str | None]] = [[None] * n_procs for _ in range(n_nodes)]
    index = graph.index
    for p, proc in enumerate(procs):
        keys = {b.key: b for b in proc.backends}
        only = (uniform or {}).get(proc.name)
        kept = profile.entry(proc.name, only) if only is not None else None
        for entry in profile.for_processor(proc.name):
            be = keys.get(entry.backend)
            if be is None:
                continue
            covers = len(entry.nodes) == n_nodes and all(n.name in entry.nodes for n in graph.nodes)
            scale = whole_model_scale(entry, covers)
            for name, cost in entry.nodes.items():
                n = index.get(name)
                if n is None or (kept is not None and entry is not kept and name in kept.nodes):
                    continue
                node = graph.nodes[n]
                want = (forced or {}).get(name)
                if (
                    want is not None
                    and want.get("processor") == proc.name
                    and want.get("backend") != entry.backend
                ):
                    continue
                dtypes = tuple(
                    dict.fromkeys(graph.tensors[t].dtype for t in node.inputs if t in graph.tensors)
                )
                if not (proc.supports(node.op_type, dtypes) and be.supports(node.op_type)):
                    continue
                lat = cost.latency_ms * scale
                if lat < ms[n, p]:
                    ms[n, p] = lat
                    energy = (
                        cost.energy_mj * scale
                        if cost.energy_mj is not None
                        else proc.active_w * lat
                    )
                    mj[n, p] = 0.0 if proc.is_remote else energy
                    backend[n][p] = entry.backend
    return ms, mj, tuple(tuple(b) for b in backend)


def _flows(graph: ModelGraph) -> tuple[Flow, ...]:
    outputs = set(graph.outputs)
    flows = []
    for name in graph.inputs:
        dsts = graph.consumers.get(name, ())
        if dsts:
            flows.append(Flow(name, graph.tensors[name].nbytes, -1, tuple(dsts), False))
    for i, node in enumerate(graph.nodes):
        for t in dict.fromkeys(node.outputs):
            dsts = graph.consumers.get(t, ())
            if dsts or t in outputs:
                flows.append(Flow(t, graph.tensors[t].nbytes, i, tuple(dsts), t in outputs))
    return tuple(flows)


def _links(device: DeviceSpec, server: DeviceSpec | None, link: NetworkLink | None):
    procs = device.processors
    n = len(procs)
    lat, per_byte, radio = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
    channel = np.zeros((n, n), dtype=np.int64)
    if any(p.is_remote for p in procs) and link is None:
        raise PlanError(
            "a server was given without a network link (pass --link or --bandwidth-mbps)"
        )
    for a, pa in enumerate(procs):
        for b, pb in enumerate(procs):
            channel[a, b] = 2 + a * n + b
            if a == b:
                continue
            if pa.is_remote and pb.is_remote:
                short = (pa.name.split(".", 1)[-1], pb.name.split(".", 1)[-1])
                gbps, ms = server.onchip_link(*short) if server is not None else device.default_link
            elif not pa.is_remote and not pb.is_remote:
                gbps, ms = device.onchip_link(pa.name, pb.name)
            else:
                assert link is not None
                up = not pa.is_remote
                mbps = link.up_mbps if up else link.down_mbps
                lat[a, b] = link.rtt_ms / 2
                per_byte[a, b] = 8e-3 / mbps
                radio[a, b] = link.tx_power_w if up else link.rx_power_w
                channel[a, b] = 0 if up else 1
                continue
            lat[a, b] = ms
            per_byte[a, b] = 1e-6 / gbps
    return lat, per_byte, radio, channel


def pin_indices(
    graph: ModelGraph, procs: tuple[Processor, ...], pins: Mapping[str, str]
) -> dict[int, int]:
    """Node index -> processor index of each pin.

    Raises:
        PlanError: listing every unknown node and processor.
    """
    names = [p.name for p in procs]
    out, bad = {}, []
    for node, proc in pins.items():
        if node not in graph.index:
            bad.append(f"unknown node '{node}'")
        elif proc not in names:
            bad.append(
                f"unknown processor '{proc}' for node '{node}' (processors: {', '.join(names)})"
            )
        else:
            out[graph.index[node]] = names.index(proc)
    if bad:
        raise PlanError("--pin: " + "; ".join(bad))
    return out


def _check_supported(graph: ModelGraph, device: DeviceSpec, supported: np.ndarray) -> None:
    """Every node runs somewhere; else one error listing every unsupported op."""
    missing = [i for i in range(len(graph.nodes)) if not supported[i].any()]
    if not missing:
        return
    by_op: dict[str, list[str]] = {}
    for i in missing:
        by_op.setdefault(graph.nodes[i].op_type, []).append(graph.nodes[i].name)
    listed = "; ".join(
        f"{op} ({', '.join(ns[:3])}{' ...' if len(ns) > 3 else ''})"
        for op, ns in sorted(by_op.items())
    )
    raise PlanError(f"no processor of {device.name} supports {len(by_op)} op(s): {listed}")


def _allowed(
    graph: ModelGraph, procs: tuple[Processor, ...], supported: np.ndarray, pins: Mapping[str, str]
) -> tuple[np.ndarray, dict[int, int]]:
    """Support and pins together, and the pins by index."""
    allowed = supported.copy()
    pin_idx = pin_indices(graph, procs, pins)
    for n, p in pin_idx.items():
        if not supported[n, p]:
            raise PlanError(
                f"--pin {graph.nodes[n].name}={procs[p].name}: {procs[p].name} cannot run "
                f"{graph.nodes[n].op_type}"
            )
        allowed[n] = False
        allowed[n, p] = True
    return allowed, pin_idx


def _add_edges(per_byte: np.ndarray, profile: Profile, procs: tuple[Processor, ...]) -> None:
    """Precision conversions at part edges, per crossing byte (see the module doc)."""

    def rate(p: Processor, key: str) -> float:
        found = [getattr(e, key) or 0.0 for e in profile.for_processor(p.name)]
        return min(found, default=0.0) / MB

    into, out_of = (
        [rate(p, "edge_in_ms_per_mb") for p in procs],
        [rate(p, "edge_out_ms_per_mb") for p in procs],
    )
    for a in range(len(procs)):
        for b in range(len(procs)):
            if a != b:
                per_byte[a, b] += out_of[a] + into[b]


def _node_memory(graph: ModelGraph) -> np.ndarray:
    """Weights plus activations written, per node."""
    return np.array(
        [
            n.weight_nbytes
            + sum(graph.tensors[t].nbytes for t in n.outputs if not graph.tensors[t].is_weight)
            for n in graph.nodes
        ],
        dtype=float,
    )


def _memory_limits(device: DeviceSpec, server: DeviceSpec | None):
    """Per-processor limits, and the limits the device's (and server's) processors share."""
    procs = device.processors
    limits = np.array([p.memory_mb * MB if p.memory_mb else np.inf for p in procs])
    groups = []
    local = tuple(i for i, p in enumerate(procs) if not p.is_remote)
    remote = tuple(i for i, p in enumerate(procs) if p.is_remote)
    if device.memory_mb:
        groups.append((local, device.memory_mb * MB))
    if server is not None and server.memory_mb and remote:
        groups.append((remote, server.memory_mb * MB))
    return limits, groups


def build_costs(
    graph: ModelGraph,
    profile: Profile,
    device: DeviceSpec,
    *,
    server: DeviceSpec | None = None,
    link: NetworkLink | None = None,
    pins: Mapping[str, str] | None = None,
    assignment: Mapping[str, Mapping[str, str]] | None = None,
    uniform: Mapping[str, str] | None = None,
) -> CostModel:
    """Price ``graph`` on ``device`` (plus ``server``) from ``profile``.

    Args:
        device: The device; when ``server`` is given and the device has no server processors yet,
            the server's processors are appended (``device.with_server(server)``).
        server: The server spec (its on-chip links and memory are used).
        link: The network link between device and server; required with a server.
        pins: ``node name -> processor name`` to force.
        assignment: A plan's ``node -> {processor, backend}``: on its processor, each node uses
            the plan's backend (to price a plan as it was compiled, whatever backend is fastest
            now).
        uniform: ``processor name -> backend``: on that processor every node the backend's entry
            has uses it, whether or not another backend is faster for the node (one backend, so
            no part boundary between backends; see :func:`edgesplit.optimize.planner.solve_plan`).

    Raises:
        PlanError: for a profile of another model, unknown pins, a server without a link, and ops
            that no processor supports (all of them listed in one message).
    """
    if profile.model_sha256 != graph.sha256:
        raise PlanError(
            f"the profile is for model {profile.model_sha256[:12]} ({profile.model_name}), "
            f"not {graph.sha256[:12]} ({graph.name})"
        )
    if server is not None and not any(p.is_remote for p in device.processors):
        device = device.with_server(server)
    procs = device.processors
    ms, mj, backend = _node_costs(graph, profile, procs, assignment, uniform)
    _check_supported(graph, device, np.isfinite(ms))
    allowed, pin_idx = _allowed(graph, procs, np.isfinite(ms), pins or {})
    lat, per_byte, radio, channel = _links(device, server, link)
    _add_edges(per_byte, profile, procs)
    limits, groups = _memory_limits(device, server)
    flows = _flows(graph)
    home = home_processor(device)
    pieces = piece_layout(graph)
    overheads = build_overheads(profile, procs, backend, [n.name for n in graph.nodes], flows, home)
    return CostModel(
        nodes=tuple(n.name for n in graph.nodes),
        op_types=tuple(n.op_type for n in graph.nodes),
        processors=tuple(p.name for p in procs),
        kinds=tuple(p.kind for p in procs),
        remote=np.array([p.is_remote for p in procs]),
        home=home,
        node_ms=ms,
        node_mj=mj,
        backend=backend,
        allowed=allowed,
        flows=flows,
        link_ms=lat,
        link_ms_per_byte=per_byte,
        radio_w=radio,
        channel=channel,
        idle_w=np.array([0.0 if p.is_remote else p.idle_w for p in procs]),
        mem_nbytes=_node_memory(graph),
        mem_limit_nbytes=limits,
        group_limits=tuple(groups),
        pins={graph.nodes[n].name: procs[p].name for n, p in pin_idx.items()},
        overheads=overheads,
        shared_cores=np.array([[shares_cores(p, q) or p is q for q in procs] for p in procs]),
        is_group=np.array([p.is_group for p in procs]),
        piece_of=pieces[0] if any(k >= 0 for k in pieces[0]) else (),
        joins=pieces[1],
    )
