"""The offload server's compute queue: a bounded FIFO of inference jobs and the threads that run
them.

The HTTP side of :mod:`edgesplit.serve.server` decodes a request, then hands one :class:`Job`
(a model, its feeds, the outputs wanted) to :meth:`ComputeQueue.submit` and awaits the outputs.
``workers`` asyncio tasks take jobs in arrival order and run each in a thread pool of the same
size, so at most ``workers`` models compute at once while the event loop stays free. At most
``max_queue`` jobs wait for a worker; one more is refused at once with :class:`QueueFull`, which
the server answers ``503`` with a ``Retry-After`` estimated from the measured compute time. A job
whose client went away before a worker took it is dropped without being computed.

Dynamic batching (``serve --max-batch N --max-queue-delay-ms D``): a worker that takes a job
also takes the waiting jobs of the same model, up to N, and may hold the batch open up to D ms
from the oldest job's arrival while new jobs of that model go straight into it. The batch runs
once (the model stacks the inputs and splits the outputs); each job still gets its own result,
and a batch that fails is run again job by job so that an error reaches only its own request.
Jobs of other models keep their places in the FIFO. The queue limit counts jobs, so
``workers * N`` may be computing while ``max_queue`` wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class Runnable(Protocol):
    """What a job runs: a served model (``ServedModel``).

    ``max_batch`` is how many requests it takes in one run (1: it cannot batch); ``run_batch``
    runs several requests stacked along the first dimension and returns one result per request.
    """

    max_batch: int

    def run(
        self, feeds: Mapping[str, np.ndarray], names: list[str]
    ) -> tuple[dict[str, np.ndarray], float]:
        """Outputs by name, and the compute time in ms."""
        ...

    def run_batch(
        self, feeds: Sequence[Mapping[str, np.ndarray]], names: Sequence[list[str]]
    ) -> list[tuple[dict[str, np.ndarray], float]]:
        """Each request's outputs, and the compute time of the whole batch in ms."""
        ...


class QueueFull(Exception):
    """The compute queue holds ``max_queue`` jobs already; try again in ``retry_after_s``."""

    def __init__(self, waiting: int, retry_after_s: int):
        super().__init__(
            f"the compute queue is full ({waiting} requests waiting); retry in {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class Budget(Protocol):
    """Bytes held at once (``ByteBudget``): the copy a batch makes of its inputs is taken from
    it."""

    def take(self, nbytes: int) -> bool: ...

    def give(self, nbytes: int) -> None: ...


@dataclass
class Job:
    """One request's compute: ``model.run(feeds, names)``; ``done`` gets its result or exception."""

    model: Runnable
    feeds: Mapping[str, np.ndarray]
    names: list[str]
    done: asyncio.Future = field(repr=False)
    queued_at: float = field(default_factory=time.monotonic)
    batch_id: int = 0  # the run that computed it (runs are numbered from 1 as they finish)
    batch_size: int = 0  # requests in that run


@dataclass
class _Open:
    """A batch a worker is filling: jobs of one model that arrive go straight into it."""

    jobs: list[Job]
    limit: int
    full: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class QueueStats:
    """The queue now: jobs waiting, jobs computing, jobs refused since start, and the runs so far
    (``runs``: model runs, ``batched_jobs``: jobs that ran in a batch of two or more)."""

    waiting: int
    computing: int
    refused: int
    compute_ms_mean: float | None
    runs: int = 0
    batched_jobs: int = 0


class ComputeQueue:
    """A bounded FIFO of :class:`Job`, run by ``workers`` threads. Create and use it on one event
    loop.

    With ``max_batch > 1``, a worker takes the oldest job and every waiting job of the same model
    (up to the model's ``max_batch``) and runs them as one batch; when that is fewer than the
    limit it waits up to ``max_delay_s`` from the oldest job's arrival for more. ``budget``
    (optional) pays for the stacked copy of a batch's inputs; when it cannot, the jobs run one by
    one. A batch that fails runs again one job at a time, so an error stays with its own request.
    """

    def __init__(
        self,
        workers: int,
        max_queue: int,
        thread_name_prefix: str = "edgesplit-compute",
        *,
        max_batch: int = 1,
        max_delay_s: float = 0.0,
        budget: Budget | None = None,
    ):
        if workers < 1 or max_queue < 0 or max_batch < 1 or not max_delay_s >= 0:
            raise ValueError(
                f"workers and max_batch must be >= 1, max_queue and max_delay_s >= 0 "
                f"(got {workers}, {max_batch}, {max_queue}, {max_delay_s})"
            )
        self.workers = workers
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self._budget = budget
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
        self._jobs: deque[Job] = deque()
        self._arrived: asyncio.Event | None = None
        self._open: dict[int, _Open] = {}  # id(model) -> the batch being filled for it
        self._tasks: list[asyncio.Task] = []
        self._computing = 0  # jobs taken by a worker (filling a batch or running)
        self._refused = 0
        self._runs = 0
        self._batched_jobs = 0
        self._compute_ms: float | None = None  # exponentially weighted mean per job

    def start(self) -> None:
        """Start the worker tasks on the running loop (idempotent)."""
        if self._tasks:
            return
        self._arrived = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._work(), name=f"compute-{i}") for i in range(self.workers)
        ]

    async def submit(self, model: Runnable, feeds: Mapping[str, np.ndarray], names: Sequence[str]):
        """Queue a job and wait for ``(outputs, compute_ms)``; :class:`QueueFull` when it is
        full."""
        job = await self.submit_job(model, feeds, names)
        return job.done.result()

    async def submit_job(
        self, model: Runnable, feeds: Mapping[str, np.ndarray], names: Sequence[str]
    ) -> Job:
        """As :meth:`submit`, but the finished :class:`Job` (its result in ``done``, and the run
        that computed it: ``batch_id`` and ``batch_size``)."""
        if self._arrived is None:
            self.start()
        assert self._arrived is not None
        if len(self._jobs) + self._computing >= self.workers * self.max_batch + self.max_queue:
            self._refused += 1
            raise QueueFull(len(self._jobs), self.retry_after_s())
        job = Job(model, feeds, list(names), asyncio.get_running_loop().create_future())
        opened = self._open.get(id(model))
        if opened is not None and len(opened.jobs) < opened.limit:
            opened.jobs.append(job)
            self._computing += 1
            if len(opened.jobs) >= opened.limit:
                opened.full.set()
        else:
            self._jobs.append(job)
            self._arrived.set()
        await job.done
        return job

    def retry_after_s(self) -> int:
        """Whole seconds until the jobs waiting now should be done (at least 1)."""
        per_job_s = (self._compute_ms or 1000.0) / 1e3
        return max(1, math.ceil(len(self._jobs) * per_job_s / self.workers))

    def stats(self) -> QueueStats:
        return QueueStats(
            len(self._jobs),
            self._computing,
            self._refused,
            self._compute_ms,
            self._runs,
            self._batched_jobs,
        )

    async def _next(self) -> Job:
        assert self._arrived is not None
        while True:
            while not self._jobs:
                self._arrived.clear()
                await self._arrived.wait()
            job = self._jobs.popleft()
            if not job.done.done():  # else the request was cancelled while it waited
                self._computing += 1
                return job

    def _take_same(self, model: Runnable, room: int) -> list[Job]:
        """Up to ``room`` waiting jobs of ``model``, oldest first; the others keep their places."""
        taken: list[Job] = []
        kept: deque[Job] = deque()
        while self._jobs and len(taken) < room:
            job = self._jobs.popleft()
            if job.model is not model:
                kept.append(job)
            elif not job.done.done():
                taken.append(job)
        kept.extend(self._jobs)
        self._jobs = kept
        self._computing += len(taken)
        return taken

    async def _gather(self, first: Job) -> list[Job]:
        limit = min(self.max_batch, getattr(first.model, "max_batch", 1))
        batch = [first]
        if limit <= 1:
            return batch
        batch += self._take_same(first.model, limit - 1)
        left_s = first.queued_at + self.max_delay_s - time.monotonic()
        if len(batch) >= limit or left_s <= 0 or id(first.model) in self._open:
            return batch
        opened = self._open[id(first.model)] = _Open(batch, limit)
        try:
            await asyncio.wait_for(opened.full.wait(), left_s)
        except TimeoutError:
            pass
        finally:
            del self._open[id(first.model)]
        return batch

    async def _work(self) -> None:
        while True:
            batch = await self._gather(await self._next())
            try:
                await self._run(batch)
            finally:
                self._computing -= len(batch)
                del batch  # the feeds are views of request bodies that go back to a pool

    async def _run(self, batch: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        live = [j for j in batch if not j.done.done()]
        if not live:
            return
        copy_nbytes = sum(a.nbytes for j in live for a in j.feeds.values()) if len(live) > 1 else 0
        if copy_nbytes and self._budget is not None and not self._budget.take(copy_nbytes):
            for job in live:  # no room for the stacked copy: one at a time, no copy
                await self._run([job])
            return
        try:
            if len(live) == 1:
                results = [
                    await loop.run_in_executor(
                        self._pool, live[0].model.run, live[0].feeds, live[0].names
                    )
                ]
            else:
                model = live[0].model
                results = await loop.run_in_executor(
                    self._pool, model.run_batch, [j.feeds for j in live], [j.names for j in live]
                )
        except Exception as e:  # noqa: BLE001 - handed to the request that asked
            if len(live) == 1:
                if not live[0].done.done():
                    live[0].done.set_exception(e)
                return
            for job in live:  # find whose request fails: each alone
                await self._run([job])
            return
        finally:
            if copy_nbytes and self._budget is not None:
                self._budget.give(copy_nbytes)
        self._runs += 1
        self._batched_jobs += len(live) if len(live) > 1 else 0
        for job in live:
            job.batch_id, job.batch_size = self._runs, len(live)
        ms = results[0][1] / len(live)
        self._compute_ms = ms if self._compute_ms is None else 0.8 * self._compute_ms + 0.2 * ms
        for job, result in zip(live, results):
            if not job.done.done():
                job.done.set_result(result)

    async def close(self) -> None:
        """Stop the workers (after the requests in flight were answered) and free the threads."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        self._pool.shutdown(wait=True)
