"""The offload server's compute queue: a bounded FIFO of inference jobs and the threads that run them.

The HTTP side of :mod:`edgesplit.runtime.server` decodes a request, then hands one :class:`Job`
(a model, its feeds, the outputs wanted) to :meth:`ComputeQueue.submit` and awaits the outputs.
``workers`` asyncio tasks take jobs in arrival order and run each in a thread pool of the same
size, so at most ``workers`` models compute at once while the event loop stays free. At most
``max_queue`` jobs wait for a worker; one more is refused at once with :class:`QueueFull`, which
the server answers ``503`` with a ``Retry-After`` estimated from the measured compute time. A job
whose client went away before a worker took it is dropped without being computed.

The worker loop (:meth:`ComputeQueue._work`) is the one place that decides what runs next, so a
batching policy (several waiting jobs of the same model run as one) replaces it and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class Runnable(Protocol):
    """What a job runs: a served model (``ServedModel``)."""

    def run(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> tuple[dict[str, np.ndarray], float]:
        """Outputs by name, and the compute time in ms."""
        ...


class QueueFull(Exception):
    """The compute queue holds ``max_queue`` jobs already; try again in ``retry_after_s``."""

    def __init__(self, waiting: int, retry_after_s: int):
        super().__init__(
            f"the compute queue is full ({waiting} requests waiting); retry in {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


@dataclass
class Job:
    """One request's compute: ``model.run(feeds, names)``; ``done`` gets its result or exception."""

    model: Runnable
    feeds: Mapping[str, np.ndarray]
    names: list[str]
    done: asyncio.Future = field(repr=False)
    queued_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class QueueStats:
    """The queue now: jobs waiting, jobs computing, and jobs refused since start."""

    waiting: int
    computing: int
    refused: int
    compute_ms_mean: float | None


class ComputeQueue:
    """A bounded FIFO of :class:`Job`, run by ``workers`` threads. Create and use it on one event loop."""

    def __init__(self, workers: int, max_queue: int, thread_name_prefix: str = "edgesplit-compute"):
        if workers < 1 or max_queue < 0:
            raise ValueError(f"workers must be >= 1 and max_queue >= 0 (got {workers}, {max_queue})")
        self.workers = workers
        self.max_queue = max_queue
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
        self._jobs: asyncio.Queue[Job] | None = None
        self._tasks: list[asyncio.Task] = []
        self._computing = 0
        self._refused = 0
        self._compute_ms: float | None = None  # exponentially weighted mean of recent jobs

    def start(self) -> None:
        """Start the worker tasks on the running loop (idempotent)."""
        if self._tasks:
            return
        self._jobs = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._work(), name=f"compute-{i}") for i in range(self.workers)]

    async def submit(self, model: Runnable, feeds: Mapping[str, np.ndarray], names: Sequence[str]):
        """Queue a job and wait for ``(outputs, compute_ms)``; :class:`QueueFull` when it is full."""
        if self._jobs is None:
            self.start()
        assert self._jobs is not None
        if self._jobs.qsize() + self._computing >= self.workers + self.max_queue:
            self._refused += 1
            raise QueueFull(self._jobs.qsize(), self.retry_after_s())
        job = Job(model, feeds, list(names), asyncio.get_running_loop().create_future())
        self._jobs.put_nowait(job)
        return await job.done

    def retry_after_s(self) -> int:
        """Whole seconds until the jobs waiting now should be done (at least 1)."""
        waiting = self._jobs.qsize() if self._jobs is not None else 0
        per_job_s = (self._compute_ms or 1000.0) / 1e3
        return max(1, math.ceil(waiting * per_job_s / self.workers))

    def stats(self) -> QueueStats:
        waiting = self._jobs.qsize() if self._jobs is not None else 0
        return QueueStats(waiting, self._computing, self._refused, self._compute_ms)

    async def _work(self) -> None:
        assert self._jobs is not None
        loop = asyncio.get_running_loop()
        while True:
            job = await self._jobs.get()
            if job.done.done():  # the request was cancelled while it waited
                continue
            self._computing += 1
            try:
                result = await loop.run_in_executor(self._pool, job.model.run, job.feeds, job.names)
            except Exception as e:  # noqa: BLE001 - handed to the request that asked
                if not job.done.done():
                    job.done.set_exception(e)
            else:
                ms = result[1]
                self._compute_ms = ms if self._compute_ms is None else 0.8 * self._compute_ms + 0.2 * ms
                if not job.done.done():
                    job.done.set_result(result)
            finally:
                self._computing -= 1
                del job  # its feeds are views of a request body that goes back to a pool

    async def close(self) -> None:
        """Stop the workers (after the requests in flight were answered) and free the threads."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        self._pool.shutdown(wait=True)
