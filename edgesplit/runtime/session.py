"""The Session: runs a bundle's parts on their processors, concurrently where the plan allows.

One worker thread per processor, pinned to its cores (and throttled by its CPU quota where the
device spec gives one). A part is submitted to its processor's worker as soon as the parts it
reads from have finished, so independent parts overlap; requests of a stream overlap the same
way, which pipelines the stages.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgesplit.compile.bundle import Manifest, PartArtifact, open_bundle
from edgesplit.cpu import configure_thread
from edgesplit.errors import RunInputError
from edgesplit.runtime.executors import Executor, make_executor


@dataclass(frozen=True)
class PartStats:
    """Timings of one part over the runs so far (ms)."""

    name: str
    processor: str
    backend: str
    runs: int
    median_ms: float
    p90_ms: float
    mean_ms: float
    predicted_ms: float | None
    executed_by: str


@dataclass(frozen=True)
class SessionStats:
    parts: tuple[PartStats, ...]
    runs: int
    median_ms: float
    p90_ms: float
    notes: tuple[str, ...] = ()


@dataclass
class _Request:
    tensors: dict[str, np.ndarray]
    waiting: dict[str, int]
    done: Future
    started: float = field(default_factory=time.perf_counter)
    left: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Worker:
    """A single thread for one processor: pinned, throttled, and owning that processor's executors."""

    def __init__(
        self, processor: str, cores: tuple[int, ...] | None, quota_pct: float | None, notes: list[str]
    ):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"edgesplit-{processor}")
        self.pool.submit(self._setup, processor, cores, quota_pct, notes).result()

    @staticmethod
    def _setup(processor: str, cores, quota_pct, notes: list[str]) -> None:
        notes.extend(configure_thread(processor, cores, quota_pct))


class Session:
    """A loaded bundle, ready to run. Build it with :func:`edgesplit.load`."""

    def __init__(
        self,
        bundle: str | os.PathLike,
        *,
        executor_options: Mapping[str, Mapping] | None = None,
        adaptive: bool = False,
    ):
        self.path = Path(bundle)
        self.manifest: Manifest = open_bundle(self.path)  # every checksum before any library loads
        self.notes: list[str] = []
        self._parts = {p.name: p for p in self.manifest.parts}
        self._users: dict[str, list[str]] = {p.name: [] for p in self.manifest.parts}
        for p in self.manifest.parts:
            for d in p.depends_on:
                self._users[d].append(p.name)
        self._workers: dict[str, _Worker] = {}
        self._executors: dict[str, Executor] = {}
        self._times: dict[str, list[float]] = {p.name: [] for p in self.manifest.parts}
        self._e2e: list[float] = []
        opts = dict(executor_options or {})
        if adaptive:  # per remote part: server or local fallback, whichever is measured faster
            opts["remote"] = {**opts.get("remote", {}), "adaptive": True}
        per_proc = Counter(p.processor for p in self.manifest.parts if not p.remote)
        for p in self.manifest.parts:
            key = _worker_key(p)
            extra = dict(opts.get("remote" if p.remote else p.backend, {}))
            if p.backend == "ort" and not p.remote and per_proc[p.processor] > 1:
                extra.setdefault("spin", False)
            if key not in self._workers:
                self._workers[key] = _Worker(
                    key, None if p.remote else p.cores, None if p.remote else p.cpu_quota_pct, self.notes
                )
            worker = self._workers[key]
            self._executors[p.name] = worker.pool.submit(make_executor, p, self.path, **extra).result()

    # ---- inputs

    def _check_inputs(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = {t.name: t for t in self.manifest.inputs}
        unknown = [k for k in inputs if k not in expected]
        missing = [k for k in expected if k not in inputs]
        if unknown or missing:
            raise RunInputError(
                f"expected inputs {', '.join(expected)}; "
                + (f"unknown {', '.join(unknown)}; " if unknown else "")
                + (f"missing {', '.join(missing)}" if missing else "")
            )
        out = {}
        for name, spec in expected.items():
            arr = np.asarray(inputs[name])
            if tuple(arr.shape) != spec.shape:
                raise RunInputError(f"input '{name}': shape {tuple(arr.shape)}, expected {spec.shape}")
            if arr.dtype != np.dtype(spec.dtype):
                raise RunInputError(f"input '{name}': dtype {arr.dtype}, expected {spec.dtype}")
            out[name] = arr
        return out

    # ---- scheduling

    def _submit(self, inputs: dict[str, np.ndarray]) -> Future:
        req = _Request(
            tensors=dict(inputs),
            waiting={p.name: len(p.depends_on) for p in self.manifest.parts},
            done=Future(),
        )
        req.left = len(self.manifest.parts)
        for p in self.manifest.parts:
            if not p.depends_on:
                self._launch(p, req)
        return req.done

    def _launch(self, part: PartArtifact, req: _Request) -> None:
        worker = self._workers[_worker_key(part)]
        ex = self._executors[part.name]

        def work() -> tuple[dict[str, np.ndarray], float]:
            t0 = time.perf_counter()
            out = ex.run(req.tensors)
            return out, (time.perf_counter() - t0) * 1e3

        fut = worker.pool.submit(work)
        fut.add_done_callback(lambda f: self._finished(part, req, f))

    def _finished(self, part: PartArtifact, req: _Request, fut: Future) -> None:
        if req.done.done():
            return
        try:
            out, ms = fut.result()
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
            if not req.done.done():
                req.done.set_exception(e)
            return
        ready = []
        with req.lock:
            req.tensors.update(out)
            self._times[part.name].append(ms)
            req.left -= 1
            for user in self._users[part.name]:
                req.waiting[user] -= 1
                if req.waiting[user] == 0:
                    ready.append(self._parts[user])
            finished = req.left == 0
        for p in ready:
            self._launch(p, req)
        if finished:
            self._e2e.append((time.perf_counter() - req.started) * 1e3)
            req.done.set_result({t.name: req.tensors[t.name] for t in self.manifest.outputs})

    # ---- public API

    def run(
        self, inputs: Mapping[str, np.ndarray], *, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        """Run one request; returns the model's outputs by name."""
        return self._submit(self._check_inputs(inputs)).result(timeout=timeout_s)

    def run_stream(
        self, inputs: Iterable[Mapping[str, np.ndarray]], *, window: int | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """Run a stream of requests, pipelined: up to ``window`` requests in flight, results in order."""
        window = window or max(2, len(self.manifest.parts) + 1)
        pending: deque[Future] = deque()
        for item in inputs:
            pending.append(self._submit(self._check_inputs(item)))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def stats(self) -> SessionStats:
        """Per-part and end-to-end latency statistics over the runs so far."""
        parts = []
        for p in self.manifest.parts:
            t = self._times[p.name] or [float("nan")]
            ex = self._executors[p.name]
            parts.append(
                PartStats(
                    p.name,
                    p.processor,
                    p.backend,
                    len(self._times[p.name]),
                    float(np.median(t)),
                    float(np.percentile(t, 90)),
                    float(np.mean(t)),
                    p.predicted_ms,
                    getattr(ex, "executed_by", p.backend),
                )
            )
        e = self._e2e or [float("nan")]
        return SessionStats(
            tuple(parts), len(self._e2e), float(np.median(e)), float(np.percentile(e, 90)), tuple(self.notes)
        )

    def remote_stats(self) -> dict:
        """Per remote part: runs on the server and on the fallback, bytes, measured link (RemoteStats)."""
        return {
            n: ex.stats()
            for n, ex in self._executors.items()
            if self._parts[n].remote and hasattr(ex, "stats")
        }

    def reset_stats(self) -> None:
        for v in self._times.values():
            v.clear()
        self._e2e.clear()

    @property
    def input_specs(self):
        return self.manifest.inputs

    def close(self) -> None:
        for ex in self._executors.values():
            ex.close()
        for w in self._workers.values():
            w.pool.shutdown(wait=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _worker_key(part: PartArtifact) -> str:
    # One worker per remote part: independent server parts wait on the network concurrently.
    return f"remote:{part.name}" if part.remote else part.processor


def load(bundle: str | os.PathLike, **kwargs) -> Session:
    """Open a bundle: verify the manifest and every checksum, then build the executors."""
    return Session(bundle, **kwargs)
