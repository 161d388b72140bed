"""The Session: runs a bundle's parts on their processors, concurrently where the plan allows.

One worker thread per processor, pinned to its cores (and throttled by its CPU quota where the
device spec gives one). A part is submitted to its processor's worker as soon as the parts it
reads from have finished, so independent parts overlap; requests of a stream overlap the same
way, which pipelines the stages.

Every request and part run is timed on one monotonic clock (``time.perf_counter_ns``): when the
part's inputs were ready, when it was submitted to its worker, when the worker started it, the
backend's run call, and when its outputs were merged (see :mod:`edgesplit.runtime.trace`).
These records are always kept (a few clock reads and one tuple per part run) and read back with
:meth:`Session.trace_records`. ``detailed=True`` also reads each run call's thread CPU time (a
system call on each side) and turns on ORT's own profiler on the ORT parts, whose kernels
(layout reorders among them) become sub-spans of the run calls; it slows the runs down, so it is
opt-in.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgesplit.bundle.format import Manifest, PartArtifact, open_verified
from edgesplit.device.cpu import configure_thread
from edgesplit.device.host import usable_cores
from edgesplit.device.throttle import borrowed, busy
from edgesplit.device.throttle import cycles as throttle_cycles
from edgesplit.errors import BundleError, RunInputError
from edgesplit.model.values import check_value
from edgesplit.runtime import affinity
from edgesplit.runtime.backends import make_executor
from edgesplit.runtime.breakdown import Breakdown, breakdown
from edgesplit.runtime.caller import caller_run
from edgesplit.runtime.executors import Executor
from edgesplit.runtime.kernels import KernelTracer
from edgesplit.runtime.trace import Trace, build_trace

if TYPE_CHECKING:
    from edgesplit.generate.generator import GenerateStats, Generator, Prefill

_clock_ns = time.perf_counter_ns


@dataclass(frozen=True)
class PartStats:
    """Timings of one part over its runs so far (ms): the last ``max_records`` of them (see
    :func:`load`), ``runs`` counting those."""

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
    number: int = 0
    start_ns: int = field(default_factory=time.perf_counter_ns)
    left: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


# Requests a stream keeps in flight, per part of the plan plus one (see Session.run_stream).
STREAM_WINDOW_PER_PART = 4


class _Worker:
    """A single thread for one processor: pinned, throttled, and owning that processor's executors.

    ``locks``: one per core the processor runs on (sorted), held while it runs a part, so that a
    core group and one of its members never run parts at once (the plan's schedule never overlaps
    them either: :mod:`edgesplit.optimize.schedule`)."""

    def __init__(self, processor: str, part: PartArtifact | None, notes: list[str], locks=()):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"edgesplit-{processor}")
        self.locks = tuple(locks)
        self.cores: frozenset[int] | None = None  # what the thread is pinned to (None: not pinned)
        self.cycles: tuple = ()  # the duty cycles serving it
        self.idle = threading.Lock()  # held by a caller running this worker's part itself
        self.pool.submit(self._setup, processor, part, notes).result()

    def _setup(self, processor: str, part: PartArtifact | None, notes: list[str]) -> None:
        if part is None:
            return
        notes.extend(
            configure_thread(
                processor,
                part.cores,
                part.cpu_quota_pct,
                threads=part.threads,
                core_quotas=part.core_quotas,
            )
        )
        if (
            part.cores
            and hasattr(os, "sched_getaffinity")
            and os.sched_getaffinity(0) != set(usable_cores())
        ):
            self.cores = frozenset(os.sched_getaffinity(0))  # pinned (not the whole machine)
        self.cycles = throttle_cycles()

    @contextlib.contextmanager
    def in_caller(self) -> Iterator[None]:
        """Make the calling thread this worker for the block: pinned to its cores and served by
        its duty cycles (its affinity restored after)."""
        before = affinity.pin_for_call(self.cores)
        try:
            with borrowed(self.cycles):
                yield
        finally:
            if before is not None:
                os.sched_setaffinity(0, before)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold this processor's cores (a no-op for a processor that shares none)."""
        with contextlib.ExitStack() as stack:
            for lock in self.locks:
                stack.enter_context(lock)
            yield


class Session:
    """A loaded bundle, ready to run. Build it with :func:`edgesplit.load`."""

    def __init__(
        self,
        bundle: str | os.PathLike,
        *,
        executor_options: Mapping[str, Mapping] | None = None,
        adaptive: bool = False,
        detailed: bool = False,
        max_records: int = 100_000,
        trust_key: str | os.PathLike | None = None,
        band_plan: int | None = None,
        verify: bool = True,
    ):
        """See :func:`load`. ``max_records`` bounds the records and timings kept, per part and of
        whole requests (oldest dropped; :meth:`stats` covers those kept)."""
        self.path = Path(bundle)
        # The signature (with a trusted key) and every checksum before any library loads; the
        # executors then load from bytes checked again as they are read.
        self.bundle = open_verified(self.path, trust_key=trust_key, verify=verify)
        self.manifest: Manifest = _plan_view(self.bundle.manifest, band_plan)
        self.notes: list[str] = []
        self.last_generate_stats = None  # GenerateStats of the last generate() run to its end
        self._parts = {p.name: p for p in self.manifest.parts}
        self._users: dict[str, list[str]] = {p.name: [] for p in self.manifest.parts}
        for p in self.manifest.parts:
            for d in p.depends_on:
                self._users[d].append(p.name)
        # the parts of each copy a request may run on (one copy of every part, without replicas)
        self._copies = [list(c) for c in self.manifest.replicas] or [list(self._parts)]
        self._in_flight = [0] * len(self._copies)
        self._copies_lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._executors: dict[str, Executor] = {}
        # the statistics' timings (ms), as the records: the last max_records of each
        self._times: dict[str, deque[float]] = {
            p.name: deque(maxlen=max_records) for p in self.manifest.parts
        }
        self._e2e: deque[float] = deque(maxlen=max_records)
        # Raw timing tuples (see trace.build_trace); deque appends are atomic, so no lock.
        self._part_records: deque[tuple] = deque(maxlen=max_records)
        self._request_records: deque[tuple[int, int, int]] = deque(maxlen=max_records)
        self._solo_runs: deque[tuple[int, int, int]] = deque(maxlen=max_records)
        self._run_counts = dict.fromkeys(
            self._parts, 0
        )  # runs since load, for ORT profile matching
        self._request_numbers = itertools.count()
        self._kernels = KernelTracer() if detailed else None
        self._cpu_clock_ns = time.thread_time_ns if detailed else None
        opts = dict(executor_options or {})
        if adaptive:  # per remote part: server or local fallback, whichever is measured faster
            opts["remote"] = {**opts.get("remote", {}), "adaptive": True}
        per_proc = Counter(p.processor for p in self.manifest.parts if not p.remote)
        shared = affinity.core_locks(self.manifest.parts)
        for p in self.manifest.parts:
            key = _worker_key(p)
            extra = dict(opts.get("remote" if p.remote else p.backend, {}))
            shares_cores = bool(shared) and bool(set(p.cores or ()) & set(shared))
            extra.setdefault(
                "shares_processor", not p.remote and (per_proc[p.processor] > 1 or shares_cores)
            )
            if (
                self._kernels is not None and not p.remote
            ):  # executors that cannot profile ignore it
                extra.update(self._kernels.executor_options(p.name))
            if key not in self._workers:
                locks = (
                    []
                    if p.remote
                    else [shared[c] for c in sorted(set(p.cores or ())) if c in shared]
                )
                self._workers[key] = _Worker(key, None if p.remote else p, self.notes, locks)
            worker = self._workers[key]
            self._executors[p.name] = worker.pool.submit(
                make_executor, p, self.bundle, **extra
            ).result()
        self._solo = self._solo_worker()
        self._pinned_callers: dict[int, tuple] = {}  # see affinity.keep_caller_on
        # name -> (shape, dtype) of every fixed-shape tensor input, for the quick check
        self._plain_inputs = {
            t.name: (tuple(t.shape), np.dtype(t.dtype))
            for t in self.manifest.inputs
            if t.kind == "tensor" and not getattr(t, "dynamic_axes", ())
        }
        if len(self._plain_inputs) != len(self.manifest.inputs):
            self._plain_inputs = {}
        # a solo part on the calling thread, its request checked after its run (see run): the
        # binding's run, the model's output names (the part makes every one) and the inputs' dtypes
        ex = self._executors[self._copies[0][0]] if self._solo else None
        self._output_names = [t.name for t in self.manifest.outputs]
        self._dtypes = [(name, dtype) for name, (_, dtype) in self._plain_inputs.items()]
        self._fast = None
        if (
            ex is not None
            and not self._solo.cycles
            and not self._solo.locks
            and self._plain_inputs
            and self._kernels is None
            and getattr(ex, "checks_inputs", False)
            and getattr(ex, "direct_binding", False)
            and set(ex.input_names) == set(self._plain_inputs)
            and set(self._output_names) <= set(ex.output_names)
        ):
            self._fast = (ex.run_binding, self._output_names, self._dtypes)
        self._solo_name = ex.part.name if ex is not None else ""
        if self._fast is not None:
            self.run = caller_run(self)  # type: ignore[method-assign]  # see caller_run

    # ---- inputs

    def _check_inputs(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        plain = self._plain_inputs
        if plain and type(inputs) is dict and len(inputs) == len(plain):
            # arrays exactly as expected (the usual case): nothing to convert, nothing to copy
            for name, value in inputs.items():
                want = plain.get(name)
                if want is None or type(value) is not np.ndarray or value.shape != want[0]:
                    break
                if value.dtype != want[1]:
                    break
            else:
                return inputs
        expected = {t.name: t for t in self.manifest.inputs}
        unknown = [k for k in inputs if k not in expected]
        missing = [k for k in expected if k not in inputs]
        if unknown or missing:
            raise RunInputError(
                f"expected inputs {', '.join(expected)}; "
                + (f"unknown {', '.join(unknown)}; " if unknown else "")
                + (f"missing {', '.join(missing)}" if missing else "")
            )
        return {name: check_value(spec, inputs[name]) for name, spec in expected.items()}

    # ---- scheduling

    def _submit(self, inputs: dict[str, np.ndarray]) -> Future:
        copy = self._take_copy()
        names = self._copies[copy]
        req = _Request(
            tensors=dict(inputs),
            waiting={n: len(self._parts[n].depends_on) for n in names},
            done=Future(),
            number=next(self._request_numbers),
        )
        req.left = len(names)
        if len(self._copies) > 1:
            req.done.add_done_callback(lambda _: self._give_copy(copy))
        if (
            not req.left
        ):  # never happens (manifests without parts are refused), but never wait on nothing
            req.done.set_exception(BundleError(f"{self.path}: the bundle has no parts"))
        for n in names:
            if not self._parts[n].depends_on:
                self._launch(self._parts[n], req, req.start_ns)
        return req.done

    def _take_copy(self) -> int:
        """The copy (of a bundle of replicas) a new request runs on: the one with the fewest
        requests in flight, the first on ties (one queue, served by whichever copy is free)."""
        if len(self._copies) == 1:
            return 0
        with self._copies_lock:
            k = min(range(len(self._copies)), key=lambda i: self._in_flight[i])
            self._in_flight[k] += 1
            return k

    def _give_copy(self, copy: int) -> None:
        with self._copies_lock:
            self._in_flight[copy] -= 1

    def _launch(self, part: PartArtifact, req: _Request, ready_ns: int) -> None:
        self._workers[_worker_key(part)].pool.submit(self._work, part, req, ready_ns, _clock_ns())

    def _work(
        self,
        part: PartArtifact,
        req: _Request,
        ready_ns: int,
        submit_ns: int,
        *,
        here: bool = False,
    ) -> None:
        """Run one part on its worker's thread (``here``: on the caller's, which holds the worker),
        then launch the parts it made ready."""
        start_ns = _clock_ns()
        if req.done.done():  # an earlier part of this request failed
            return
        worker = self._workers[_worker_key(part)]
        try:
            # a throttled processor's duty cycle runs while it works; a core group holds its cores
            with contextlib.nullcontext() if here else worker.idle, worker.holding(), busy():
                self._run_part(part, req, ready_ns, submit_ns, start_ns)
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
            if not req.done.done():
                req.done.set_exception(e)

    def _run_part(
        self, part: PartArtifact, req: _Request, ready_ns: int, submit_ns: int, start_ns: int
    ) -> None:
        out, stamps = self._execute(part, req.tensors)
        run_index = self._next_run(part.name)
        ready = []
        with req.lock:
            req.tensors.update(out)
            req.left -= 1
            for user in self._users[part.name]:
                req.waiting[user] -= 1
                if req.waiting[user] == 0:
                    ready.append(self._parts[user])
            finished = req.left == 0
            done_ns = _clock_ns()
        self._record(
            part.name, req.number, run_index, (ready_ns, submit_ns, start_ns), stamps, done_ns
        )
        for p in ready:
            self._launch(p, req, done_ns)
        if finished:
            result = {t.name: req.tensors[t.name] for t in self.manifest.outputs}
            self._finish(req.number, req.start_ns)
            req.done.set_result(result)

    def _execute(
        self, part: PartArtifact, tensors: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], tuple[int, int, int, int | None]]:
        """Run ``part``'s executor on ``tensors``: its outputs, and (run start, run end,
        collected, thread CPU time of the run or None) in ns."""
        ex = self._executors[part.name]
        call = getattr(ex, "call", None)
        cpu = self._cpu_clock_ns
        cpu_ns = cpu() if cpu else 0  # read outside the run call, so it does not lengthen it
        if call is None:  # an executor without phases: its whole run is the run call
            run_start_ns = _clock_ns()
            out = ex.run(tensors)
            run_end_ns = _clock_ns()
            cpu_ns = cpu() - cpu_ns if cpu else None
            return out, (run_start_ns, run_end_ns, _clock_ns(), cpu_ns)
        args = ex.gather(tensors)
        run_start_ns = _clock_ns()
        raw = call(args)
        run_end_ns = _clock_ns()
        cpu_ns = cpu() - cpu_ns if cpu else None
        out = ex.collect(raw)
        return out, (run_start_ns, run_end_ns, _clock_ns(), cpu_ns)

    def _next_run(self, name: str) -> int:
        """This part's run index (runs since load, for ORT profile matching); only the part's
        worker (or the caller standing in for it) counts it."""
        run_index = self._run_counts[name]
        self._run_counts[name] = run_index + 1
        return run_index

    def _record(
        self,
        name: str,
        number: int,
        run_index: int,
        queued: tuple[int, int, int],
        stamps: tuple[int, int, int, int | None],
        done_ns: int,
    ) -> None:
        """Keep one part run's timings: ``queued`` (ready, submitted, started) and ``stamps``
        (see :meth:`_execute`), in ns (see trace.build_trace)."""
        ready_ns, submit_ns, start_ns = queued
        run_start_ns, run_end_ns, collected_ns, cpu_ns = stamps
        self._times[name].append((collected_ns - start_ns) / 1e6)
        self._part_records.append(
            (
                number,
                name,
                run_index,
                ready_ns,
                submit_ns,
                start_ns,
                run_start_ns,
                run_end_ns,
                collected_ns,
                done_ns,
                cpu_ns,
            )
        )

    def _finish(self, number: int, start_ns: int, end_ns: int | None = None) -> None:
        end_ns = _clock_ns() if end_ns is None else end_ns
        self._e2e.append((end_ns - start_ns) / 1e6)
        self._request_records.append((number, start_ns, end_ns))

    # ---- public API

    def run(
        self, inputs: Mapping[str, np.ndarray], *, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        """Run one request; returns the model's outputs by name.

        A bundle of one local part (plain ONNX Runtime, a whole model on one processor) is run on
        the calling thread itself, as that part's worker, when the worker is free and no
        ``timeout_s`` is asked for: the hand-off to the worker and back cost 0.1-0.2 ms a request
        here, 4-5% of squeezenet over both cores. A part pinned to some cores (``only:big``)
        pins the calling thread there and leaves it pinned after the call, until this Session
        closes, so that the next call pays no system call (a thread its owner pinned there is left
        alone; a call of a part on every core gives it its old affinity back at once). A throttled
        part (its duty cycles) or one on shared cores pins the caller for the call only.

        A one-part ONNX Runtime bundle with fixed input shapes checks the request after its run
        instead of before (see :func:`edgesplit.runtime.caller.caller_run`)."""
        solo = self._solo
        if solo is not None and timeout_s is None and solo.idle.acquire(blocking=False):
            try:
                if not solo.cycles and not solo.locks:
                    return self._run_plain(inputs, solo.cores)
                feeds = self._check_inputs(inputs)
                with solo.in_caller():
                    return self._run_here(feeds)
            finally:
                solo.idle.release()
        return self._submit(self._check_inputs(inputs)).result(timeout=timeout_s)

    def _run_plain(
        self, inputs: Mapping[str, np.ndarray], cores: frozenset[int] | None
    ) -> dict[str, np.ndarray]:
        """The only part, on the calling thread (pinned to the worker's ``cores`` and left there:
        :func:`~edgesplit.runtime.affinity.keep_caller_on`), when its worker is neither throttled
        nor holding cores: no request object, no future, no context managers."""
        number = next(self._request_numbers)
        start_ns = _clock_ns()
        affinity.keep_caller_on(cores, self._pinned_callers)
        feeds = self._check_inputs(inputs)
        part = self._parts[self._copies[0][0]]
        out, stamps = self._execute(part, feeds)
        self._record(
            part.name, number, self._next_run(part.name), (start_ns,) * 3, stamps, stamps[2]
        )
        result = {t.name: out[t.name] if t.name in out else feeds[t.name]
                  for t in self.manifest.outputs}  # fmt: skip
        self._finish(number, start_ns)
        return result

    def _fold_solo_runs(self) -> None:
        """The runs :meth:`run` kept as (start, run start, end) tuples for a one-part bundle, as
        the records, statistics and numbers every other run gets (numbered as they are folded)."""
        runs, name = self._solo_runs, self._solo_name
        while runs:
            try:
                start_ns, run_start_ns, end_ns = runs.popleft()
            except IndexError:  # another reader took the last one
                break
            number = next(self._request_numbers)
            stamps = (run_start_ns, end_ns, end_ns, None)  # collected as it ended
            # ready, submitted and started as the call began
            self._record(name, number, self._next_run(name), (start_ns,) * 3, stamps, end_ns)
            self._finish(number, start_ns, end_ns)

    def _solo_worker(self) -> _Worker | None:
        """The worker of a bundle's only part, when it is local (None otherwise)."""
        if len(self._copies) != 1 or len(self._copies[0]) != 1:
            return None
        part = self._parts[self._copies[0][0]]
        return None if part.remote else self._workers[_worker_key(part)]

    def _run_here(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        req = _Request(
            tensors=dict(feeds), waiting={}, done=Future(), number=next(self._request_numbers)
        )
        req.left = 1
        part = self._parts[self._copies[0][0]]
        self._work(part, req, req.start_ns, _clock_ns(), here=True)
        return req.done.result()

    def generate(
        self,
        input_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int,
        *,
        chunk_tokens: int = 32,
        eos_token_id: int | None = None,
        move_cache: bool = False,
        max_cache_tokens: int | None = None,
        prefill: Prefill | None = None,
    ) -> Iterator[int]:
        """Greedy tokens after ``input_ids``, streamed, from a bundle whose model is a decoder.

        The bundle must be one local ONNX Runtime part holding the whole decoder with dynamic
        sequence and cache lengths; the prompt is prefilled in chunks of ``chunk_tokens`` (0: in
        one run), and the KV cache stays bound in place on the part's processor between steps
        (``move_cache`` passes it through host memory instead, as a plan that moves it would). Once
        the iterator is exhausted, :attr:`last_generate_stats` holds its figures
        (:class:`edgesplit.generate.GenerateStats`: ``ttft_ms``, ``decode_tokens_per_s``,
        ``cache_copies`` ...) and the run calls count in :meth:`stats`. ``prefill``: a prefill to
        run instead (a server's: :class:`edgesplit.generate.offload.RemotePrefill`); the decode
        steps bind the cache it returns.

        Raises:
            InputError: before anything runs: a bundle that cannot generate (one line saying
                why; see :mod:`edgesplit.runtime.generating`), or a bad request (ids outside the
                vocabulary, a negative count, a cache past ``max_cache_tokens`` or the model's
                limit).
        """
        gen = self.generator(chunk_tokens, move_cache, max_cache_tokens)
        return self.generate_with(gen, input_ids, max_new_tokens, eos_token_id, prefill)

    def generator(
        self,
        chunk_tokens: int = 32,
        move_cache: bool = False,
        max_cache_tokens: int | None = None,
    ) -> Generator:
        """The :class:`edgesplit.generate.Generator` over this bundle's one part (see
        :meth:`generate`), for :meth:`generate_with`: one per session serves many requests.

        Raises:
            InputError: a bundle that cannot generate (one line saying why).
        """
        from edgesplit.runtime.generating import bundle_generator

        return bundle_generator(
            str(self.path),
            self.manifest,
            self._executors,
            self.bundle.read,
            (chunk_tokens, move_cache, max_cache_tokens),
        )

    def generate_with(
        self,
        gen: Generator,
        input_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        prefill: Prefill | None = None,
    ) -> Iterator[int]:
        """:meth:`generate` with a generator from :meth:`generator`."""
        from edgesplit.runtime.generating import pinned_tokens

        part = self.manifest.parts[0]

        def done(stats: GenerateStats) -> None:
            self._times[part.name].extend(stats.run_ms)
            self.last_generate_stats = stats

        request = (input_ids, max_new_tokens, eos_token_id, prefill)
        return pinned_tokens(self._workers[_worker_key(part)], gen, request, done)

    @property
    def stream_window(self) -> int:
        """Requests :meth:`run_stream` keeps in flight by default."""
        return STREAM_WINDOW_PER_PART * (len(self.manifest.parts) + 1)

    def run_stream(
        self, inputs: Iterable[Mapping[str, np.ndarray]], *, window: int | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """Run a stream of requests, pipelined: up to ``window`` requests in flight, results in
        order.

        The default, :data:`STREAM_WINDOW_PER_PART` requests per part and as many again, keeps every
        worker's queue full, which is what a plan's period assumes (its busiest processor's parts,
        back to back). Parts that alternate between processors need it: a 4-part resnet18 pipeline
        on two cores (core0, core1, core0, core1; 23.9 ms of parts per core) measured a period of
        26.6 ms with 5 requests in flight, 23.6 with 10 and 22.0 with 20 (predicted 22.6); a 2-part
        mobilenetv2 on big and little 9.96, 9.00 and 8.53 ms with 3, 6 and 12 (predicted 7.1)."""
        window = window or self.stream_window
        pending: deque[Future] = deque()
        for item in inputs:
            pending.append(self._submit(self._check_inputs(item)))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def stats(self) -> SessionStats:
        """Per-part and end-to-end latency statistics over the runs so far (the last
        ``max_records``)."""
        self._fold_solo_runs()
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
            tuple(parts),
            len(self._e2e),
            float(np.median(e)),
            float(np.percentile(e, 90)),
            tuple(self.notes),
        )

    def remote_stats(self) -> dict:
        """Per remote part: runs on the server and on the fallback, bytes, measured link
        (RemoteStats)."""
        return {
            n: ex.stats()
            for n, ex in self._executors.items()
            if self._parts[n].remote and hasattr(ex, "stats")
        }

    def remote_executors(self) -> list[Executor]:
        """The executors of the remote parts, in part order."""
        return [self._executors[p.name] for p in self.manifest.parts if p.remote]

    def trace_records(self) -> Trace:
        """The timing records of the requests and part runs since load or :meth:`reset_stats`.

        Kernel records (ORT engine runs and kernels) are there once :meth:`end_detailed_trace`
        has been called on a Session loaded with ``detailed=True``.
        """
        self._fold_solo_runs()
        trace = build_trace(
            self._part_records.copy(),
            self._request_records.copy(),
            self.manifest.parts,
            _worker_key,
        )
        if self._kernels is None:
            return trace
        return self._kernels.attach(trace)

    @property
    def detailed(self) -> bool:
        """Whether ORT's profiler runs on the ORT parts (``load(..., detailed=True)``)."""
        return self._kernels is not None

    def end_detailed_trace(self) -> Trace:
        """Stop ORT's profiler on the ORT parts and read its kernels into the records.

        Only for a Session loaded with ``detailed=True`` (else a :class:`BundleError`); runs
        after the first call are no longer profiled. Returns :meth:`trace_records`.
        """
        if self._kernels is None:
            raise BundleError(f"{self.path}: load the bundle with detailed=True to trace kernels")
        if not self._kernels.ended:
            ended = {}
            for name, ex in self._executors.items():
                end = getattr(ex, "end_profiling", None)
                if end is not None:
                    ended[name] = (
                        self._workers[_worker_key(self._parts[name])].pool.submit(end).result()
                    )
            self._kernels.read(ended)
        return self.trace_records()

    def breakdown(self, requests: Iterable[int] | None = None) -> Breakdown:
        """Where the time went, per part and per request (see :func:`breakdown`)."""
        trace = self.trace_records()
        if requests is not None:
            trace = trace.select(requests)
        return breakdown(trace, self.manifest)

    def reset_stats(self) -> None:
        """Forget the timings so far (statistics and timing records)."""
        self._solo_runs.clear()
        for v in self._times.values():
            v.clear()
        self._e2e.clear()
        self._part_records.clear()
        self._request_records.clear()

    @property
    def input_specs(self):
        return self.manifest.inputs

    def close(self) -> None:
        """Close the executors and workers, and give the threads this Session left pinned (see
        :meth:`run`) their affinity back."""
        affinity.release_callers(self._pinned_callers)
        self.__dict__.pop("run", None)  # the one-part closure (caller_run) and what it holds
        self._fast = None
        for ex in self._executors.values():
            ex.close()
        for w in self._workers.values():
            w.pool.shutdown(wait=True)
        if self._kernels is not None:
            self._kernels.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _plan_view(manifest: Manifest, band_plan: int | None) -> Manifest:
    """The manifest as one plan of an adaptive bundle sees it: that plan and only its parts."""
    if manifest.bands is None and band_plan is None:
        return manifest
    plan = manifest.plan if band_plan is None else manifest.bands.plans[band_plan].plan  # type: ignore[union-attr]
    return replace(manifest, parts=manifest.plan_parts(band_plan), plan=plan)


def _worker_key(part: PartArtifact) -> str:
    # One worker per remote part: independent server parts wait on the network concurrently.
    return f"remote:{part.name}" if part.remote else part.processor


def load(bundle: str | os.PathLike, **kwargs) -> Session:
    """Open a bundle: verify the manifest and every checksum, then build the executors.

    Keyword arguments: ``executor_options`` (per backend: options for its executors),
    ``adaptive`` (remote parts pick server or fallback by measurement), ``detailed`` (ORT's
    profiler on the ORT parts, read with :meth:`Session.end_detailed_trace`), ``max_records``,
    ``trust_key`` (an ed25519 public key file: the bundle must be signed by it, see
    :mod:`edgesplit.bundle.signing`),
    ``band_plan`` (in an adaptive bundle, run that band plan instead of the default plan; see
    :mod:`edgesplit.runtime.bands` for switching between them), ``verify`` (check checksums).
    """
    return Session(bundle, **kwargs)
