"""Pricing one choice of plans for a whole fleet: the server's batching and queueing from the load.

The model (pure, no I/O; every figure per request unless its name says otherwise):

* Group ``g`` has ``count`` devices, each sending ``rate_per_s`` requests a second (open loop:
  a camera's frames, say). A candidate plan runs ``device_ms`` on the device and the link, and
  ``server_ms`` on the server at batch size 1 (the server part's profiled time); all on the device
  it has no server part (``key`` None).
* Candidates with the same ``key`` run the same server part (the same model, server processor and
  server nodes), so their requests can be batched together, whichever group sent them.
* ``replicas`` identical servers each take an equal share of every part's requests. Per replica,
  a part with request rate ``lam`` (per ms) batches what arrives within the batching window:
  ``batch = clamp(lam * max_queue_delay_ms, 1, max_batch)``. A batch of ``b`` takes
  ``shared_ms + (server_ms - shared_ms) * b``: ``shared_ms`` is the part's weight-bound share,
  read once per batch (see docs/serving.md, "When batching pays").
* The batches queue for ``slots`` compute slots: an M/M/c queue whose jobs are batches (Erlang C).
  Its waiting time has the tail ``P(W > t) = C exp(-(c mu - Lambda) t)``, which gives the p50 and
  p95 of the wait in closed form.
* A request waits for its batch to form for at most ``window = min(max_queue_delay_ms,
  (max_batch - 1) / lam)``: p95 ``window``, p50 ``window / 2`` (a lone request, batch 1, waits the
  whole window).
* A request's p95 is ``device_ms + batch time + batch wait p95 + queue wait p95`` (a sum of
  percentiles: never below the percentile of the sum, so conservative). Device energy is the
  candidate's alone plus the device's idle power over the extra mean time it waits.
* A replica whose utilisation reaches ``max_utilisation`` is saturated: every offloading request
  is priced at an infinite p95.

The fleet's score, compared as a tuple (smaller is better): the total deadline miss (sum over
groups of requests a second times ``max(0, p95 - deadline)``), then the device energy a second of
the groups whose objective is ``energy``, then the request-weighted p95 of the groups whose
objective is ``latency``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import gammaln, pdtr

OBJECTIVE_FIGURES = {"energy": "energy_mj", "latency": "p95_ms"}
"""What a group's objective minimises for it: a :class:`Pricing` field (device energy or p95)."""
OBJECTIVES = tuple(OBJECTIVE_FIGURES)
SATURATED_MS = 1e9
"""The p95 priced for a request to a saturated server (finite, so misses still compare)."""


@dataclass(frozen=True)
class Candidate:
    """One plan a group may run, priced alone (no other device on the server).

    Attributes:
        name: What it is (``only:npu``, ``cut@35``, ``solver:energy`` ...).
        key: The server part's identity (same key: batchable together); None: all on device.
        device_ms: Latency of the request without its server part (device compute, transfers).
        energy_mj: Device energy per request, alone (compute, radio, idle while waiting).
        idle_w: The device's idle power while it waits longer than alone.
        server_ms: The server part's time at batch size 1 (0 without one).
        shared_ms: The share of ``server_ms`` that a batch pays once (weights read).
    """

    name: str
    key: str | None
    device_ms: float
    energy_mj: float
    idle_w: float = 0.0
    server_ms: float = 0.0
    shared_ms: float = 0.0


@dataclass(frozen=True)
class Group:
    """Devices alike: the same spec, link, deadline and model, and the plans they may run."""

    name: str
    count: int
    rate_per_s: float
    deadline_p95_ms: float
    objective: str
    candidates: tuple[Candidate, ...]

    @property
    def requests_per_s(self) -> float:
        return self.count * self.rate_per_s

    @property
    def figure(self) -> str:
        """The :class:`Pricing` field its objective minimises (:data:`OBJECTIVE_FIGURES`)."""
        return OBJECTIVE_FIGURES[self.objective]

    @property
    def minimises_energy(self) -> bool:
        return self.figure == "energy_mj"


@dataclass(frozen=True)
class Server:
    """The batching server the groups share (each of ``replicas`` alike)."""

    slots: int = 1
    max_batch: int = 1
    max_queue_delay_ms: float = 0.0
    replicas: int = 1
    max_utilisation: float = 0.95


@dataclass(frozen=True)
class Pricing:
    """What one choice (a candidate per group) costs.

    Attributes:
        score: (total miss in ms a second, device energy a second in mJ of ``energy`` groups,
            request-weighted p95 of ``latency`` groups): smaller is better, compared in order.
        p50_ms, p95_ms, energy_mj: Per group, per request.
        utilisation: Of one replica's slots (>= ``max_utilisation``: saturated).
        batch: Per server part key in use, the mean batch size.
    """

    choice: tuple[int, ...]
    score: tuple[float, float, float]
    p50_ms: tuple[float, ...]
    p95_ms: tuple[float, ...]
    energy_mj: tuple[float, ...]
    utilisation: float
    saturated: bool
    batch: dict[str, float] = field(default_factory=dict)


def erlang_c(c: int, offered: np.ndarray | float) -> np.ndarray:
    """Probability that a job waits in an M/M/c queue with ``offered`` = Lambda / mu (< c), per
    element: Erlang B from the Poisson distribution (``pmf(c) / cdf(c)``), then Erlang C."""
    a = np.maximum(np.asarray(offered, dtype=float), 1e-300)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        blocking = np.exp(c * np.log(a) - a - gammaln(c + 1)) / pdtr(c, a)
        out = blocking / (1.0 - a / c * (1.0 - blocking))
    return np.where(np.asarray(offered) > 0, np.clip(out, 0.0, 1.0), 0.0)


class FleetTable:
    """The groups' candidates as arrays, priced fast for any choice (see the module doc)."""

    def __init__(self, groups: Sequence[Group], server: Server):
        self.groups, self.server = tuple(groups), server
        keys: dict[str, int] = {}
        for g in self.groups:
            for c in g.candidates:
                if c.key is not None:
                    keys.setdefault(c.key, len(keys))
        self.keys = tuple(keys)
        n_keys = len(keys)
        self.key_server_ms = np.zeros(n_keys)
        self.key_shared_ms = np.zeros(n_keys)
        self.cand: list[dict[str, np.ndarray]] = []
        for g in self.groups:
            kid = np.array([keys[c.key] if c.key is not None else -1 for c in g.candidates])
            for c, k in zip(g.candidates, kid):
                if k >= 0:  # the same part on the same server: the dearest figure, to be safe
                    self.key_server_ms[k] = max(self.key_server_ms[k], c.server_ms)
                    self.key_shared_ms[k] = max(
                        self.key_shared_ms[k], min(c.shared_ms, c.server_ms)
                    )
            self.cand.append(
                {
                    "key": kid,
                    "device_ms": np.array([c.device_ms for c in g.candidates], dtype=float),
                    "energy_mj": np.array([c.energy_mj for c in g.candidates], dtype=float),
                    "idle_w": np.array([c.idle_w for c in g.candidates], dtype=float),
                    "server_ms": np.array([c.server_ms for c in g.candidates], dtype=float),
                }
            )
        self.key_per_item_ms = self.key_server_ms - self.key_shared_ms
        self.rate_per_ms = np.array([g.requests_per_s / 1000.0 for g in self.groups])
        self.weight = np.array([g.requests_per_s for g in self.groups])
        self.deadline_ms = np.array([g.deadline_p95_ms for g in self.groups])
        self.is_energy = np.array([g.minimises_energy for g in self.groups])
        n_lat = self.weight[~self.is_energy].sum()
        self.latency_weight = np.where(~self.is_energy, self.weight / n_lat if n_lat else 0.0, 0.0)

    def arrays(self, choice: Sequence[int]) -> tuple[np.ndarray, ...]:
        """Per group: the chosen candidate's key id, device ms, energy, idle power, server ms."""
        cs = [self.cand[g] for g in range(len(self.groups))]
        return tuple(
            np.array([c[f][i] for c, i in zip(cs, choice)], dtype=dt)
            for f, dt in zip(_FIELDS, (np.int64, float, float, float, float))
        )

    def price(self, choice: Sequence[int], server: Server | None = None) -> Pricing:
        """The fleet's figures for ``choice`` (a candidate index per group) on ``server`` (the
        table's own when None)."""
        s = server or self.server
        arrays = [a[None, :] for a in self.arrays(choice)]
        scores, (p50, p95, energy, util, sat, batch) = self.score_rows(arrays, s)
        key = arrays[0][0]
        used = {self.keys[k]: round(float(batch[0, k]), 6) for k in np.unique(key[key >= 0])}
        return Pricing(
            tuple(int(i) for i in choice),
            tuple(float(v) for v in scores[0]),
            tuple(float(v) for v in p50[0]),
            tuple(float(v) for v in p95[0]),
            tuple(float(v) for v in energy[0]),
            float(util[0]),
            bool(sat[0]),
            used,
        )

    def score(self, choice: Sequence[int], server: Server | None = None) -> tuple:
        """Only :attr:`Pricing.score` of :meth:`price` (what the search compares)."""
        arrays = [a[None, :] for a in self.arrays(choice)]
        return tuple(float(v) for v in self.score_rows(arrays, server or self.server)[0][0])

    def score_rows(self, arrays: Sequence[np.ndarray], s: Server):
        """Scores of many choices at once: ``arrays`` as :meth:`arrays` gives them, each with a
        row per choice (rows x groups). Returns the scores (rows x 3) and the per-group
        figures (p50, p95, energy: rows x groups; utilisation, saturated: rows; batch sizes:
        rows x keys)."""
        key, dev, mj, idle, srv1 = arrays
        rows, n_keys = key.shape[0], len(self.keys)
        on = key >= 0
        # one column more than there are keys: key -1 (all on device) lands there, with no load
        col = np.where(on, key, n_keys)
        flat = (col + (n_keys + 1) * np.arange(rows)[:, None]).ravel()
        weights = (self.rate_per_ms[None, :] * on).ravel()
        lam = np.bincount(flat, weights, minlength=rows * (n_keys + 1)).reshape(rows, n_keys + 1)
        lam /= s.replicas
        window = s.max_queue_delay_ms if s.max_batch > 1 else 0.0
        batch = np.clip(lam * window, 1.0, float(s.max_batch))
        batch_ms = np.zeros_like(lam)
        batch_ms[:, :n_keys] = self.key_shared_ms + self.key_per_item_ms * batch[:, :n_keys]
        jobs = lam / batch  # batches a ms
        offered = (jobs * batch_ms).sum(axis=1)
        total_jobs = jobs[:, :n_keys].sum(axis=1)
        util = offered / s.slots
        saturated = on.any(axis=1) & (util >= s.max_utilisation)
        ok = (offered > 0) & ~saturated
        pw = np.where(ok, erlang_c(s.slots, np.where(ok, offered, 0.0)), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            drain = np.where(ok, s.slots * total_jobs / offered - total_jobs, 1.0)
            wait95 = np.where(pw > 0.05, np.log(np.maximum(pw, 1e-300) / 0.05) / drain, 0.0)
            wait50 = np.where(pw > 0.5, np.log(np.maximum(pw, 1e-300) / 0.5) / drain, 0.0)
            full_ms = np.where(lam > 0, (s.max_batch - 1) / lam, np.inf)
        wait_mean = pw / drain
        form95 = np.where(batch > 1.0, np.minimum(window, full_ms), window)
        form50 = np.where(batch > 1.0, form95 / 2, form95)
        r = np.arange(rows)[:, None]
        srv_b, f95, f50 = batch_ms[r, col], form95[r, col], form50[r, col]
        p50 = dev + np.where(on, srv_b + f50 + wait50[:, None], 0.0)
        p95 = dev + np.where(on, srv_b + f95 + wait95[:, None], 0.0)
        extra_mean = np.where(on, srv_b - srv1 + f50 + wait_mean[:, None], 0.0)
        p50 = np.where(on & saturated[:, None], SATURATED_MS, p50)
        p95 = np.where(on & saturated[:, None], SATURATED_MS, p95)
        energy = mj + idle * np.maximum(extra_mean, 0.0)
        miss = (self.weight * np.maximum(p95 - self.deadline_ms, 0.0)).sum(axis=1)
        fleet_mj = (self.weight * self.is_energy * energy).sum(axis=1)
        lat = (self.latency_weight * p95).sum(axis=1)
        scores = np.round(np.stack([miss, fleet_mj, lat], axis=1), 6)
        return scores, (p50, p95, energy, util, saturated, batch)


_FIELDS = ("key", "device_ms", "energy_mj", "idle_w", "server_ms")


def energy_at_mj(c: Candidate, latency_ms: float) -> float:
    """The device energy of one request of ``c`` whose answer took ``latency_ms`` from the moment
    the device started it: its energy alone, plus the device's idle power over the time it waited
    longer than alone (less, shorter). The pricing's rule, applied to a measured latency; a plan
    all on the device costs its energy alone."""
    if c.key is None:
        return c.energy_mj
    return c.energy_mj + c.idle_w * (max(latency_ms, c.device_ms) - (c.device_ms + c.server_ms))


def best_row(scores: np.ndarray) -> int:
    """The row of ``scores`` (rows x 3) that is smallest in order (first of equals)."""
    return int(np.lexsort((scores[:, 2], scores[:, 1], scores[:, 0]))[0])
