"""Random cost models for tests and benchmarks: layered DAGs with costs made in code.

No ONNX model or profile is involved; :func:`random_costs` fills a :class:`CostModel` directly,
deterministically from a seed.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

import numpy as np

from edgesplit.optimize.costs import CostModel, Flow


def layered_edges(
    n_nodes: int, rng: np.random.Generator, *, width: int = 4, max_preds: int = 2, skip: float = 0.1
) -> list[tuple[int, ...]]:
    """Predecessors of each node of a random layered DAG in topological order."""
    preds: list[tuple[int, ...]] = []
    layers: list[list[int]] = []
    n = 0
    while n < n_nodes:
        size = min(int(rng.integers(1, width + 1)), n_nodes - n)
        layer = list(range(n, n + size))
        for _ in layer:
            if not layers:
                preds.append(())
                continue
            pool = layers[-1]
            k = int(rng.integers(1, min(max_preds, len(pool)) + 1))
            ps = set(rng.choice(pool, size=k, replace=False).tolist())
            if len(layers) > 1 and rng.random() < skip:
                older = [j for lay in layers[:-1] for j in lay]
                ps.add(int(rng.choice(older)))
            preds.append(tuple(sorted(ps)))
        layers.append(layer)
        n += size
    return preds


def block_edges(
    n_nodes: int, rng: np.random.Generator, *, max_branches: int = 4, max_len: int = 6
) -> list[tuple[int, ...]]:
    """Predecessors of a DNN-like DAG: chains broken by blocks of parallel branches that fork from
    one node and join in the next (residual and inception blocks)."""
    preds: list[tuple[int, ...]] = [()]
    last = 0
    while len(preds) < n_nodes:
        if rng.random() < 0.4:
            for _ in range(int(rng.integers(1, max_len + 1))):
                if len(preds) >= n_nodes:
                    break
                preds.append((last,))
                last = len(preds) - 1
            continue
        ends = []
        for _ in range(int(rng.integers(1, max_branches + 1))):
            prev = last
            for _ in range(int(rng.integers(0, max_len))):
                if len(preds) >= n_nodes - 1:
                    break
                preds.append((prev,))
                prev = len(preds) - 1
            ends.append(prev)
        if len(preds) >= n_nodes:
            break
        preds.append(tuple(sorted(set(ends))))
        last = len(preds) - 1
    return preds[:n_nodes]


def _flows(preds: list[tuple[int, ...]], rng: np.random.Generator) -> list[Flow]:
    """One graph input read by node 0, each node's output to its readers; the last node's is the
    graph output."""
    n_nodes = len(preds)
    consumers: dict[int, list[int]] = {}
    for i, ps in enumerate(preds):
        for p in ps:
            consumers.setdefault(p, []).append(i)
    nbytes = rng.integers(1_000, 400_000, n_nodes)
    flows = [Flow("input", int(rng.integers(10_000, 600_000)), -1, (0,), False)]
    for i in range(n_nodes):
        dsts = tuple(consumers.get(i, ()))
        if dsts or i == n_nodes - 1:
            flows.append(Flow(f"t{i}", int(nbytes[i]), i, dsts, i == n_nodes - 1))
    return flows


def _links(remote: np.ndarray, rng: np.random.Generator):
    """Random on-chip links, and one random network link between the device and the server."""
    n_procs = len(remote)
    lat = rng.uniform(0.01, 0.3, (n_procs, n_procs))
    per_byte = 1e-6 / rng.uniform(2.0, 20.0, (n_procs, n_procs))
    radio = np.zeros((n_procs, n_procs))
    channel = 2 + np.arange(n_procs * n_procs).reshape(n_procs, n_procs)
    up, down, rtt = rng.uniform(1, 200), rng.uniform(5, 400), rng.uniform(2, 60)
    for a in range(n_procs):
        for b in range(n_procs):
            if remote[a] != remote[b]:
                lat[a, b] = rtt / 2
                per_byte[a, b] = 8e-3 / (up if remote[b] else down)
                radio[a, b] = 2.5 if remote[b] else 1.5
                channel[a, b] = 0 if remote[b] else 1
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(per_byte, 0.0)
    return lat, per_byte, radio, channel


class RandomShape(TypedDict, total=False):
    """What kind of cost model :func:`random_costs` draws (every key optional)."""

    n_remote: int
    """The last processors are a server's (default 1)."""
    unsupported: float
    """Probability that a (node, processor) other than the home CPU's is unsupported (0.1)."""
    width: int
    """Nodes a layer of a layered DAG (default 4)."""
    chain: bool
    """A chain instead of a DAG."""
    memory: bool
    """Memory sizes and limits too."""
    device_like: bool
    """Speed-ups that depend on an op class, as in a roofline model."""
    blocks: bool
    """A DNN-like DAG of blocks (:func:`block_edges`)."""


def random_costs(
    n_nodes: int,
    n_procs: int,
    seed: int = 0,
    **shape: Unpack[RandomShape],
) -> CostModel:
    """A random cost model: a layered DAG (or a chain) on ``n_procs`` processors.

    ``blocks`` gives a DNN-like DAG (:func:`block_edges`), ``device_like`` costs whose speed-ups
    depend on an op class as in a roofline model. Processor 0 is the home CPU and runs every op; the
    last ``n_remote`` processors are a server
    reached over a random network link. Each other (node, processor) is unsupported with
    probability ``unsupported``.
    """
    n_remote, unsupported, width = (
        shape.get("n_remote", 1),
        shape.get("unsupported", 0.1),
        shape.get("width", 4),
    )
    chain, memory = shape.get("chain", False), shape.get("memory", False)
    device_like, blocks = shape.get("device_like", False), shape.get("blocks", False)
    rng = np.random.default_rng(seed)
    if chain:
        preds = [((i - 1,) if i else ()) for i in range(n_nodes)]
    elif blocks:
        preds = block_edges(n_nodes, rng)
    else:
        preds = layered_edges(n_nodes, rng, width=width)
    n_remote = min(n_remote, n_procs - 1)
    remote = np.array([p >= n_procs - n_remote for p in range(n_procs)])
    speed = np.concatenate([[1.0], rng.uniform(0.2, 3.0, n_procs - 1)])
    work = rng.uniform(0.05, 2.0, n_nodes)
    ms = work[:, None] / speed[None, :] * rng.uniform(0.7, 1.3, (n_nodes, n_procs))
    if device_like:
        # op classes (dense, elementwise, reshaping) whose speed-up differs per processor, as in
        # a roofline model: accelerators gain on dense ops, little on memory-bound ones
        klass = rng.choice(3, size=n_nodes, p=[0.4, 0.4, 0.2])
        gain = np.stack([speed * 3.0, np.sqrt(speed), np.ones(n_procs)])
        gain[:, 0] = 1.0
        ms = work[:, None] / gain[klass] + 0.01
    ms[rng.random((n_nodes, n_procs)) < unsupported] = np.inf
    ms[:, 0] = work + 0.01 if device_like else work  # the home CPU runs everything
    active_w = rng.uniform(0.5, 6.0, n_procs)
    mj = np.where(remote[None, :], 0.0, np.where(np.isfinite(ms), ms, 0.0) * active_w[None, :])
    flows = _flows(preds, rng)
    lat, per_byte, radio, channel = _links(remote, rng)
    mem = rng.integers(10_000, 2_000_000, n_nodes).astype(float)
    limits = np.full(n_procs, np.inf)
    if memory:
        limits[1:] = rng.uniform(0.2, 0.8, n_procs - 1) * mem.sum()
    return CostModel(
        nodes=tuple(f"n{i}" for i in range(n_nodes)),
        op_types=tuple("Op" for _ in range(n_nodes)),
        processors=tuple(f"p{i}" if not remote[i] else f"server.p{i}" for i in range(n_procs)),
        kinds=tuple("cpu" if i == 0 else ("gpu" if i % 2 else "npu") for i in range(n_procs)),
        remote=remote,
        home=0,
        node_ms=ms,
        node_mj=mj,
        backend=tuple(
            tuple("ort" if np.isfinite(ms[n, p]) else None for p in range(n_procs))
            for n in range(n_nodes)
        ),
        allowed=np.isfinite(ms),
        flows=tuple(flows),
        link_ms=lat,
        link_ms_per_byte=per_byte,
        radio_w=radio,
        channel=channel,
        idle_w=np.where(remote, 0.0, rng.uniform(0.05, 0.5, n_procs)),
        mem_nbytes=mem,
        mem_limit_nbytes=limits,
    )


def random_overheads(cm: CostModel, seed: int = 0) -> CostModel:
    """``cm`` with random per-part, hand-off, request and contention terms on its local
    processors (:mod:`edgesplit.optimize.overheads`), for tests of the part-level schedule."""
    from dataclasses import replace

    from edgesplit.optimize.overheads import Overheads, PairCost

    rng = np.random.default_rng(seed)
    local = [p for p in range(cm.n_procs) if not cm.remote[p]]
    pair = {
        (p, "ort"): PairCost(
            part_ms=float(rng.uniform(0.0, 0.3)),
            in_ms_per_byte=float(rng.uniform(0.0, 2e-8)),
            out_ms_per_byte=float(rng.uniform(0.0, 2e-8)),
            reorder_ms_per_byte=float(rng.uniform(0.0, 5e-8)),
            crossing_ms=float(rng.uniform(0.0, 0.05)),
        )
        for p in local
    }
    # per-tensor reorder figures for half the flows (their own generator: the draws above stay as
    # they were for a given seed)
    tables = np.random.default_rng(seed + 7919)
    for key, c in pair.items():
        into = {
            f.tensor: float(tables.uniform(0.0, 0.2)) for f in cm.flows if tables.random() < 0.5
        }
        out = {f.tensor: float(tables.uniform(0.0, 0.2)) for f in cm.flows if tables.random() < 0.5}
        pair[key] = replace(c, reorder_in_ms=into, reorder_out_ms=out)
    gaps = np.array([0.0, 1.0, 5.0, 20.0])
    handoff = np.zeros((cm.n_procs, len(gaps)))
    for p in local:
        handoff[p] = np.sort(rng.uniform(0.01, 0.3, len(gaps)))
    contention = np.ones((cm.n_procs, cm.n_procs))
    for p in local:
        for q in local:
            if p != q:
                contention[p, q] = float(rng.uniform(1.0, 1.5))
    ov = Overheads(
        pair=pair,
        blocked_out=rng.random((len(cm.flows), cm.n_procs)) < 0.5,
        blocked_in=rng.random((cm.n_nodes, cm.n_procs)) < 0.5,
        handoff_gaps_ms=np.tile(gaps, (cm.n_procs, 1)),
        handoff_ms=handoff,
        return_gaps_ms=gaps,
        return_ms=np.sort(rng.uniform(0.01, 0.3, len(gaps))),
        session_ms=float(rng.uniform(0.0, 0.1)),
        contention=contention,
        active_w=np.where(cm.remote, 0.0, rng.uniform(0.5, 4.0, cm.n_procs)),
    )
    return replace(cm, overheads=ov)
