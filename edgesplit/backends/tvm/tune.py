"""Tune a model's kernels with MetaSchedule, on a budget, into a database per target.

:func:`tune_module` extracts the model's kernels (MetaSchedule *tasks*, one per distinct fused TIR
function), leaves out those a database for this target already holds with the per-task budget
(:mod:`edgesplit.backends.tvm.database`: a conv tuned for resnet18 is not tuned again for
mobilenetv2),
and tunes the rest with at most ``trials_per_task`` trials each (and ``max_trials`` in all).
Candidates are compiled by one builder process per usable core and measured one at a time, either
here (the runner process pinned to the processor's cores, with its thread count) or on a board
through TVM's RPC server (:class:`RpcEndpoint`, see :mod:`edgesplit.backends.tvm.rpc`). Progress is
reported per measured candidate; new records are appended to the target's database as they come,
so an interrupted run keeps what it measured and the next run tunes only what is missing (with a
``max_trials`` cap, MetaSchedule's gradient scheduler commits nothing before it has visited every
kernel once).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesplit.backends.tvm.database import (
    cache_dir,
    find_databases,
    lower_for_tuning,
    register_tensor_intrinsics,
    write_target_file,
)
from edgesplit.util import Progress


@dataclass(frozen=True)
class RpcEndpoint:
    """A TVM RPC server to measure candidates on (here: the local end of an SSH tunnel)."""

    host: str
    port: int
    session_timeout_s: int = 60


@dataclass(frozen=True)
class TuneOptions:
    """How much to tune, and where candidates are built and measured.

    Attributes:
        trials_per_task: Measured candidates per kernel (a task already holding this many records
            in a database for the target is not tuned again).
        max_trials: A cap on the candidates measured in this run, over all tasks (None: no cap).
        threads: The threads the processor runs with; it sets the tuning target's ``num-cores``
            and the runner's ``TVM_NUM_THREADS``. None: the cores this process may use.
        cores: Pin the local runner to these cores (the processor's own); None: not pinned.
        builder_workers: Processes that compile candidates (None: one per usable core).
        rpc: Measure on this RPC server instead of a local runner process.
        database: Where new records go (default: the target's cache folder).
        population: Evolutionary search population (None: 16 per candidate of a round, 32 to 512).
        trials_per_iter: Candidates per search round of a task (None: a quarter of the per-task
            budget, 4 to 64). Below ``trials_per_task``, a ``max_trials`` cap lets MetaSchedule's
            gradient scheduler give the later rounds to the kernels that gain most.
        timeout_s: Per candidate build, and per run.
    """

    trials_per_task: int = 64
    max_trials: int | None = None
    threads: int | None = None
    cores: tuple[int, ...] | None = None
    builder_workers: int | None = None
    rpc: RpcEndpoint | None = None
    database: Path | None = None
    population: int | None = None
    trials_per_iter: int | None = None
    timeout_s: float = 120.0
    seed: int = 0
    extra_databases: tuple[Path, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class TuneReport:
    """What a tuning run did.

    Attributes:
        tasks: Kernels in the model (distinct workloads).
        reused: Kernels left alone: a database already had the per-task budget for them.
        tuned: Kernels that got trials in this run (fewer than the rest when ``max_trials`` ran
        out).
        trials: Candidates measured in this run (new records in ``database``).
        measured_on: ``here``, or the SSH target whose RPC server measured the candidates.
        rpc_sessions: Sessions that server served (one per measured candidate), from its own log.
        population: The evolutionary search's population asked for (None: the default rule).
    """

    database: str
    target: Mapping[str, Any]
    tasks: int
    reused: int
    tuned: int
    trials: int
    trials_per_task: int
    elapsed_s: float
    task_names: tuple[str, ...] = ()
    measured_on: str = "here"
    rpc_sessions: int | None = None
    population: int | None = None


def tune_module(
    mod, target: Mapping[str, Any], options: TuneOptions, progress: Progress | None = None
):
    """Tune the kernels of a Relax module (as imported from ONNX) for ``target``.

    Returns:
        (the module lowered for tuning, the :class:`TuneReport`); the caller applies the databases
        to the lowered module (:func:`edgesplit.backends.tvm.database.apply_databases`).
    """
    from tvm.s_tir import meta_schedule as ms

    started = time.perf_counter()
    lookup = find_databases(target, options.threads, extra=options.extra_databases)
    out = Path(options.database) if options.database else cache_dir(lookup.tuning)
    write_target_file(out, lookup.tuning)
    ms.database.JSONDatabase(work_dir=str(out))  # creates the two files when new
    register_tensor_intrinsics(lookup.tuning)
    lowered = lower_for_tuning(mod, lookup.tuning)
    with contextlib.redirect_stdout(io.StringIO()):
        tasks = ms.relax_integration.extract_tasks(lowered, tvm_target(lookup.tuning))
    paths = [out, *(p for p in lookup.paths if p.resolve() != out.resolve())]
    left = _remaining(tasks, paths, options.trials_per_task)
    todo = [(t, n) for t, n in zip(tasks, left) if n > 0]
    budget = sum(n for _, n in todo)
    if options.max_trials is not None:
        budget = min(budget, options.max_trials)
    run = _Run(lookup.tuning, out, options, _Counter(progress, f"tune {out.name}"[:24], budget))
    run.counter.report()
    for per_task, group in _by_budget(todo).items():
        if run.counter.done >= budget:
            break
        run.tune(group, per_task, min(per_task * len(group), budget - run.counter.done))
    run.counter.finish()
    after = _remaining(tasks, paths, options.trials_per_task) if todo else left
    report = TuneReport(
        database=str(out),
        target=lookup.tuning,
        tasks=len(tasks),
        reused=len(tasks) - len(todo),
        tuned=sum(1 for a, b in zip(after, left) if a < b),
        trials=run.counter.done,
        trials_per_task=options.trials_per_task,
        elapsed_s=round(time.perf_counter() - started, 3),
        task_names=tuple(t.task_name for t in tasks),
        population=options.population,
    )
    return lowered, report


def tvm_target(tuning: Mapping[str, Any]):
    import tvm

    return tvm.target.Target(dict(tuning))


def _remaining(tasks, paths: list[Path], per_task: int) -> list[int]:
    """Per task: trials still to run so that the databases hold ``per_task`` records for it."""
    from tvm.s_tir import meta_schedule as ms

    dbs = [
        ms.database.JSONDatabase(work_dir=str(p), allow_missing=False) for p in paths if p.is_dir()
    ]
    left = []
    for task in tasks:
        mod = task.dispatched[0]
        have = 0
        for db in dbs:
            if db.has_workload(mod):
                have += len(db.get_top_k(db.commit_workload(mod), per_task))
        left.append(max(0, per_task - have))
    return left


def _by_budget(todo) -> dict[int, list]:
    groups: dict[int, list] = {}
    for task, n in todo:
        groups.setdefault(n, []).append(task)
    return dict(sorted(groups.items(), reverse=True))


@dataclass
class _Run:
    """One tuning run: where records go, how candidates are built and measured, and the count."""

    tuning: Mapping[str, Any]
    out: Path
    options: TuneOptions
    counter: _Counter

    def tune(self, tasks, per_task: int, budget: int) -> None:
        """Tune ``tasks`` with ``per_task`` trials each and ``budget`` in all."""
        from tvm.s_tir import meta_schedule as ms

        opts = self.options
        workers = opts.builder_workers or len(os.sched_getaffinity(0))
        per_iter = opts.trials_per_iter or max(4, min(64, per_task // 4))
        population = opts.population or max(32, min(512, 16 * per_iter))
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=population, init_min_unmeasured=min(50, population // 2)
        )
        # MetaSchedule logs its tables to a console handler bound to sys.stdout when tuning starts;
        # its own log files (in ``logs``) keep them. Its logging setup lists the handlers already on
        # its logger by name and fails on one without (pytest adds such), so those are dropped.
        _drop_unnamed_handlers()
        with (
            tempfile.TemporaryDirectory(prefix="edgesplit-tune-") as logs,
            contextlib.redirect_stdout(_null()),
        ):
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                tasks, logs, strategy=strategy, num_threads=workers, seed=opts.seed
            )
            ms.tune.tune_tasks(
                tasks=contexts,
                task_weights=weights,
                work_dir=logs,
                max_trials_global=budget,
                max_trials_per_task=per_task,
                num_trials_per_iter=per_iter,
                # The gradient scheduler joins no task's measurements (so commits no records) until
                # it has visited every task once: a run stopped within that first pass kept nothing
                # (seen here on mobilenetv2 and resnet18). Round-robin commits each task's as they
                # come; the gradient one only pays when a cap leaves tasks short of their budget.
                task_scheduler="gradient" if budget < per_task * len(tasks) else "round-robin",
                builder=ms.builder.LocalBuilder(
                    max_workers=workers,
                    timeout_sec=opts.timeout_s,
                    f_build=build_candidate,
                    f_export=functools.partial(
                        export_candidate, cc=_cross_cc(self.tuning), parent=logs
                    ),
                ),
                runner=_runner(opts),
                database=ms.database.JSONDatabase(work_dir=str(self.out)),
                measure_callbacks=[
                    *ms.measure_callback.MeasureCallback.create("default"),
                    self.counter.callback(),
                ],
                cost_model=ms.cost_model.CostModel.create("xgb", num_tuning_cores=workers),
            )


class _Counter:
    """Counts measured candidates and reports them (through a MetaSchedule measure callback)."""

    def __init__(self, progress: Progress | None, label: str, total: int):
        self.progress, self.label, self.total = progress, label, total
        self.done = 0

    def report(self) -> None:
        if self.progress is not None:
            self.progress(self.label, min(self.done, self.total), self.total)

    def finish(self) -> None:
        """The run is over: tasks whose search space ran out end early, so the bar is completed."""
        if self.progress is not None:
            self.progress(self.label, self.total, self.total)

    def callback(self):
        from tvm.ir.utils import derived_object
        from tvm.s_tir import meta_schedule as ms

        outer = self

        @derived_object
        class _Callback(ms.measure_callback.PyMeasureCallback):
            def apply(
                self, task_scheduler, task_id, measure_candidates, builder_results, runner_results
            ):
                outer.done += len(measure_candidates)
                outer.report()

        return _Callback()


def _runner(options: TuneOptions):
    from tvm.s_tir import meta_schedule as ms

    if options.rpc is not None:
        rpc = options.rpc
        return ms.runner.RPCRunner(
            # We connect to the server directly, without a tracker: the tracker fields carry its
            # address.
            rpc_config=ms.runner.RPCConfig(
                tracker_host=rpc.host,
                tracker_port=rpc.port,
                tracker_key="edgesplit",
                session_timeout_sec=rpc.session_timeout_s,
            ),
            f_create_session=rpc_session,
            max_workers=1,
        )
    return ms.runner.LocalRunner(
        timeout_sec=options.timeout_s,
        initializer=functools.partial(_pin_runner, tuple(options.cores or ()), options.threads),
    )


def _drop_unnamed_handlers() -> None:
    import logging

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(logger.handlers):
        if handler.get_name() is None:
            logger.removeHandler(handler)


@functools.cache
def _null():
    return open(os.devnull, "w")  # noqa: SIM115 - kept open: MetaSchedule's handlers may write later


# -- run in MetaSchedule's worker processes (referenced by name, so they must stay module-level) --


def build_candidate(mod, target, _params):
    """MetaSchedule's default build, without registering every target's tensor intrinsics."""
    register_tensor_intrinsics(dict(target.export()))
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def export_candidate(mod, cc: str | None = None, parent: str | None = None) -> str:
    """A shared library linked here (a cross compiler for another CPU), so the runner, local or on
    a board without a C compiler, only loads it. It goes under ``parent`` (the tuning run's own
    temporary folder, removed when the run ends), so a run of many trials leaves nothing behind."""
    import tvm

    path = os.path.join(tempfile.mkdtemp(prefix="edgesplit-cand-", dir=parent), "candidate.so")
    if cc:
        mod.export_library(path, fcompile=tvm.support.cc.cross_compiler(cc))
    else:
        mod.export_library(path)
    return path


def rpc_session(rpc_config):
    """An RPC session straight to the server named in ``rpc_config`` (no tracker)."""
    from tvm import rpc

    return rpc.connect(
        rpc_config.tracker_host,
        int(rpc_config.tracker_port),
        session_timeout=rpc_config.session_timeout_sec,
    )


def _pin_runner(cores: tuple[int, ...], threads: int | None) -> None:
    if threads:
        os.environ["TVM_NUM_THREADS"] = str(threads)
    if cores:
        os.sched_setaffinity(0, set(cores))


def _cross_cc(tuning: Mapping[str, Any]) -> str | None:
    from edgesplit.backends.tvm.build import cross_compiler

    return cross_compiler(tuning)


def tune_model(
    model: str | os.PathLike,
    device: str = "host",
    processor: str | None = None,
    *,
    options: TuneOptions | None = None,
    input_shapes: Mapping[str, Any] | None = None,
    remote: str | None = None,
    ssh=None,
    progress: Progress | None = None,
) -> TuneReport:
    """Tune a whole model's kernels ahead of time for one processor of ``device``.

    The target, thread count and cores come from the processor's ``tvm`` backend (the first CPU
    with one when ``processor`` is None). With ``remote`` (``user@host[:port]``, reached with the
    :class:`~edgesplit.profile.ssh.SshOptions` ``ssh``), candidates are measured on that host
    through TVM's RPC server there (:class:`~edgesplit.backends.tvm.rpc.RemoteRpcServer`); they are
    always compiled here, with the cross compiler the target needs.

    Raises:
        InputError: the processor is unknown or has no tvm backend.
    """
    import dataclasses

    from edgesplit.device.spec import load_device
    from edgesplit.errors import InputError
    from edgesplit.model.load import load_model

    spec = load_device(device)
    if processor is not None:
        proc = spec.processor(processor)  # DeviceSpecError names the known ones
        if not any(b.key == "tvm" for b in proc.backends):
            raise InputError(f"{spec.name}: processor '{proc.name}' has no tvm backend")
    else:
        proc = next(
            (
                p
                for p in spec.processors
                if not p.is_remote and any(b.key == "tvm" for b in p.backends)
            ),
            None,
        )
        if proc is None:
            raise InputError(f"{spec.name}: no processor has a tvm backend")
    target = dict(proc.backend("tvm").target or {"kind": "llvm"})
    graph = load_model(model, input_shapes or None)
    opts = dataclasses.replace(
        options or TuneOptions(), threads=proc.threads or (options.threads if options else None)
    )
    from tvm.relax.frontend.onnx import from_onnx

    with contextlib.redirect_stdout(io.StringIO()):
        mod = from_onnx(graph.model, keep_params_in_input=False)
    if remote is None:
        opts = dataclasses.replace(opts, cores=opts.cores or proc.cores)
        _, report = tune_module(mod, target, opts, progress)
    else:
        from edgesplit.backends.tvm.rpc import RemoteRpcServer

        with RemoteRpcServer(remote, ssh, threads=proc.threads, cores=proc.cores) as server:
            opts = dataclasses.replace(opts, rpc=RpcEndpoint("127.0.0.1", server.port))
            _, report = tune_module(mod, target, opts, progress)
            stats = server.stats()
            report = dataclasses.replace(
                report, measured_on=str(server.target), rpc_sessions=stats.sessions
            )
    _record_run(Path(report.database), report, graph.name, proc.name)
    return report


def _record_run(folder: Path, report: TuneReport, model: str, processor: str) -> None:
    """Append what this run cost to the database's ``target.json`` (shipped databases say it)."""
    import datetime

    from edgesplit.backends.tvm.database import read_target_file

    meta = read_target_file(folder) or {}
    runs = list(meta.get("runs", []))
    runs.append(
        {
            "model": model,
            "processor": processor,
            "measured_on": report.measured_on,
            "trials_per_task": report.trials_per_task,
            "population": report.population,
            "tasks": report.tasks,
            "tuned": report.tuned,
            "reused": report.reused,
            "trials": report.trials,
            "elapsed_s": report.elapsed_s,
            "builder_cores": len(os.sched_getaffinity(0)),
            "date": datetime.date.today().isoformat(),
        }
    )
    extra = {k: v for k, v in meta.items() if k not in ("target", "tvm_version", "runs")}
    write_target_file(folder, report.target, runs=runs, **extra)
