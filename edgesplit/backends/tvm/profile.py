"""Profile a model on Apache TVM (Relax VM), kernel by kernel, with the tuned schedules there are.

TVM's VM reports fused function names, not ONNX nodes (DESIGN.md), so the profiler extracts the
groups of nodes TVM fuses into one kernel (:func:`fusion_groups`: an op and the chain of
elementwise ops that follows it, such as Conv -> Add -> Relu), compiles each group for the
processor's target and times it on the processor's worker thread (pinned and throttled as the
runtime's); the group's time is shared among its nodes in proportion to their roofline cost, as
the ORT profiler shares a fused kernel's. Measuring the fused group, not each node alone, is what
lets the tuning databases apply: they hold schedules for the kernels a whole model compiles to
(:mod:`edgesplit.backends.tvm.database`), and a Conv measured without its ReLU would be another,
untuned,
kernel. Groups with the same ops, attributes and shapes share one measurement. The whole model is
compiled and timed too; where TVM cannot import it, the profile
says why.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from edgesplit.backends.tvm.database import (
    Lookup,
    apply_databases,
    find_databases,
    lower_for_tuning,
)
from edgesplit.backends.tvm.kept_libs import kept_library
from edgesplit.device.cpu import configure_as
from edgesplit.device.spec import Backend, Processor
from edgesplit.device.throttle import busy, busy_call
from edgesplit.model.extract import PartExtractor
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph, Node
from edgesplit.profile.predict import roofline_ms
from edgesplit.profile.store import MEASURED, NodeCost, ProcessorProfile, RunTerms
from edgesplit.profile.terms import MicroRun, MicroRunner, build_terms, neg_model
from edgesplit.util import Progress

if TYPE_CHECKING:
    from edgesplit.profile.backends import ProfileTask

RUNNABLE_HERE = ("llvm", "c")  # target kinds whose code runs on this CPU
GPU_KINDS = ("cuda", "rocm", "metal", "vulkan", "opencl")  # target kinds with a device of their own


def target_device(target: Mapping[str, Any]):
    """The TVM device a library built for ``target`` runs on: its GPU (device 0), or the CPU."""
    import tvm

    kind = target.get("kind", "llvm")
    return tvm.device(kind if kind in GPU_KINDS else "cpu", 0)


_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def host_arch() -> str:
    import platform

    return _ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower())


def target_arch(target: Mapping[str, Any]) -> str:
    """The CPU architecture a target's code is for (its ``mtriple``'s; no triple: this
    machine's)."""
    triple = target.get("mtriple")
    return _ARCH_ALIASES.get(triple.split("-")[0], triple.split("-")[0]) if triple else host_arch()


def runs_on_this_machine(target: Mapping[str, Any]) -> bool:
    """Whether code built for ``target`` runs here (to profile it, and for compile to check it
    against ORT): a CPU target of this machine's architecture, or a GPU target whose device TVM
    finds here."""
    kind = target.get("kind", "llvm")
    if kind in GPU_KINDS:
        return bool(target_device(dict(target)).exist)
    return kind in RUNNABLE_HERE and target_arch(target) == host_arch()


@contextlib.contextmanager
def processor_worker(processor: Processor) -> Iterator[ThreadPoolExecutor]:
    """A thread set up as ``processor``'s runtime worker (pinned, throttled), to time on."""
    with ThreadPoolExecutor(1, initializer=lambda: configure_as(processor)) as worker:
        yield worker


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:200]


def build_vm(
    model: onnx.ModelProto, target: dict[str, Any], threads: int | None = None, tuned: bool = True
):
    """Import an ONNX model into Relax, compile it for ``target`` and return (vm, device).

    With ``tuned``, the kernels the tuning databases for ``target`` run with ``threads`` threads
    hold are scheduled as tuned (:func:`edgesplit.backends.tvm.database.find_databases`).

    The library is kept (:mod:`edgesplit.backends.tvm.kept_libs`): a kernel profiled again, in this
    model or another, is loaded instead of compiled. Where a library cannot be exported or loaded
    (no C compiler on a device, a temporary folder mounted without exec), the compiled module runs
    as it is, and nothing is kept.
    """
    from tvm import relax

    lookup = find_databases(target, threads) if tuned else None
    kept = kept_library(model, target, threads, lookup, None, __name__)
    dev = target_device(target)
    with tempfile.TemporaryDirectory(prefix="edgesplit-tvm-") as tmp:
        lib = Path(tmp) / "lib.so"
        if (
            kept is not None
            and kept.fetch(lib) is not None
            and (vm := _loaded(lib, dev)) is not None
        ):
            return vm, dev
        ex = _compile(model, target, lookup)
        if kept is not None and _exported(ex, lib) and (vm := _loaded(lib, dev)) is not None:
            kept.keep(lib, {"target": dict(target)})
            return vm, dev
    return relax.VirtualMachine(ex, dev), dev


def _compile(model: onnx.ModelProto, target: dict[str, Any], lookup: Lookup | None):
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        mod = from_onnx(model, keep_params_in_input=False)
        tgt = dict(target)
        if lookup is not None and lookup.paths:
            mod = apply_databases(lower_for_tuning(mod, lookup.tuning), lookup.tuning, lookup.paths)
            tgt = dict(lookup.tuning)
        return tvm.compile(mod, target=tvm.target.Target(tgt))


def _exported(ex, lib: Path) -> bool:
    """Whether ``ex`` was exported as a shared library at ``lib`` (it needs a C compiler)."""
    try:
        ex.export_library(str(lib))
    except Exception:  # noqa: BLE001 - TVM raises many types; the module still runs unexported
        return False
    return True


def _loaded(lib: Path, dev):
    """A VM of the library at ``lib``; None where it cannot be loaded."""
    import tvm
    from tvm import relax

    try:
        return relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    except Exception:  # noqa: BLE001 - TVM raises many types; the caller compiles instead
        return None


def time_vm(vm, dev, arrays: list[np.ndarray], runs: int) -> list[float]:
    """Per-run latencies in ms of ``vm['main']`` (TVM's own time evaluator)."""
    import tvm

    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    vm["main"](*args)  # warm-up, and to size the repeat count
    t0 = time.perf_counter()
    vm["main"](*args)
    once_s = time.perf_counter() - t0
    repeat = max(3, min(runs, int(2.0 / max(once_s, 1e-6))))
    res = vm.time_evaluator("main", dev, number=1, repeat=repeat)(*args)
    return [r * 1e3 for r in res.results]


# Ops TVM's FuseOps folds into the kernel of the op before them (elementwise and broadcast ops).
FUSED_AFTER = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid",
        "HardSwish", "Tanh", "Exp", "Erf", "Sqrt", "Neg", "Abs", "Pow", "BatchNormalization",
        "Identity", "Cast",
    }
)  # fmt: skip


def fusion_groups(graph: ModelGraph, nodes: list[Node]) -> list[list[Node]]:
    """``nodes`` (in topological order) in the groups TVM compiles into one kernel each: a node and
    the elementwise nodes that follow it, each fed by the group's last output and its only
    reader."""
    readers: dict[str, int] = {}
    for n in graph.nodes:
        for t in dict.fromkeys(n.inputs):
            readers[t] = readers.get(t, 0) + 1
    for t in graph.outputs:
        readers[t] = readers.get(t, 0) + 1
    groups: list[list[Node]] = []
    open_by_tail: dict[str, list[Node]] = {}  # a group's single output -> the group
    for node in nodes:
        acts = [t for t in node.inputs if not graph.tensors[t].is_weight]
        group = next((open_by_tail[t] for t in acts if t in open_by_tail), None)
        if node.op_type in FUSED_AFTER and group is not None and len(node.outputs) == 1:
            open_by_tail.pop(group[-1].outputs[0], None)
            group.append(node)
        else:
            group = [node]
            groups.append(group)
        if len(node.outputs) == 1 and readers.get(node.outputs[0], 0) == 1:
            open_by_tail[node.outputs[0]] = group
    return groups


def _signature(node: Node, proto: onnx.NodeProto, graph: ModelGraph) -> str:
    attrs = b"".join(a.SerializeToString() for a in proto.attribute)
    ins = ";".join(
        f"{graph.tensors[t].shape}{graph.tensors[t].dtype}"
        f"{'w' if graph.tensors[t].is_weight else ''}"
        for t in node.inputs
    )
    return f"{node.op_type}|{attrs.hex()}|{ins}"


def profile_tvm(
    graph: ModelGraph,
    processor: Processor,
    backend: Backend,
    *,
    runs: int = 10,
    progress: Progress | None = None,
) -> ProcessorProfile:
    """Measure every fused kernel TVM can import on ``backend.target`` (run here: this CPU, or a GPU
    TVM finds here), with the schedules the tuning databases for the processor's target and threads
    hold. A GPU kernel's time is TVM's time evaluator on the device (its own timer); the whole model
    and the part terms include the copies in and out, as the runtime's part runs do."""
    started = time.perf_counter()
    target = dict(backend.target or {"kind": "llvm"})
    label = f"{processor.name}/tvm"
    if not runs_on_this_machine(target):
        return ProcessorProfile(
            processor.name,
            backend.key,
            MEASURED,
            {},
            {},
            note=f"target {target} does not run on this machine",
        )
    cant = [
        n
        for n in graph.nodes
        if not backend.supports(n.op_type) or not processor.supports(n.op_type)
    ]
    unsupported: dict[str, str] = {
        n.name: f"TVM has no {n.op_type} converter"
        if not backend.supports(n.op_type)
        else f"{n.op_type} is not supported by {processor.name}"
        for n in cant
    }
    with processor_worker(processor) as worker:
        whole_ms = whole_p90 = None
        if not cant:
            try:
                whole_ms, whole_p90 = _whole_model(graph, target, processor.threads, worker, runs)
                note = ""
            except Exception as e:  # noqa: BLE001 - TVM raises many types; we report the reason
                note = f"TVM cannot compile the whole model: {_first_line(e)}"
        else:
            note = (
                f"TVM cannot run {len(cant)} nodes ({', '.join(sorted({n.op_type for n in cant}))})"
            )
        nodes = _measure_groups(
            graph, processor, target, unsupported, runs, worker, progress, label
        )
        terms = _terms(worker, target, max(5, runs // 2 + 2))
    lookup = find_databases(target, processor.threads)
    tuned = (
        f"tuned schedules from {', '.join(p.name for p in lookup.paths)}"
        if lookup.paths
        else f"untuned: no tuning database for {lookup.tuning}"
    )
    return ProcessorProfile(
        processor.name,
        backend.key,
        MEASURED,
        nodes,
        unsupported,
        whole_model_ms=whole_ms,
        whole_model_p90_ms=whole_p90,
        note="; ".join(x for x in (note, tuned) if x),
        elapsed_s=time.perf_counter() - started,
        terms=terms,
    )


def _whole_model(
    graph: ModelGraph, target: dict[str, Any], threads, worker: ThreadPoolExecutor, runs: int
):
    """Median and p90 of the whole model run as a one-part bundle runs it: handed to the worker,
    inputs copied in, ``main``, outputs copied out, the caller woken (as ORT's is measured)."""
    vm, dev = build_vm(graph.model, target, threads)
    feeds = random_inputs(graph)
    arrays = [feeds[n] for n in graph.inputs]

    def run() -> None:
        raw = vm["main"](*[tvm_tensor(a, dev) for a in arrays])
        [v.numpy() for v in ([raw] if hasattr(raw, "numpy") else list(raw))]

    samples = []
    for k in range(runs + 2):
        t0 = time.perf_counter()
        worker.submit(busy_call, run).result()
        if k >= 2:
            samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples)), float(np.percentile(samples, 90))


def _measure_groups(
    graph: ModelGraph,
    processor: Processor,
    target: dict[str, Any],
    unsupported: dict[str, str],
    runs: int,
    worker: ThreadPoolExecutor,
    progress: Progress | None,
    label: str,
) -> dict[str, NodeCost]:
    """Time each fused group once per distinct signature; share its time among its nodes.

    Nodes whose group TVM cannot compile go into ``unsupported`` with the reason."""
    extractor = PartExtractor(graph)  # follows control-flow subgraphs' outer-scope reads
    protos = {p.name: p for p in graph.model.graph.node}
    cache: dict[str, list[float] | str] = {}
    groups = fusion_groups(graph, [n for n in graph.nodes if n.name not in unsupported])
    rng = np.random.default_rng(0)
    nodes: dict[str, NodeCost] = {}
    for k, group in enumerate(groups):
        sig = "||".join(_signature(n, protos[n.name], graph) for n in group)
        if sig not in cache:
            cache[sig] = _measure_group(
                graph, group, extractor, target, processor.threads, runs, rng, worker
            )
        got = cache[sig]
        if isinstance(got, str):
            unsupported.update({n.name: got for n in group})
        else:
            nodes.update(_share(group, np.asarray(got), processor))
        if progress is not None:
            progress(label, k + 1, len(groups))
    return nodes


def _share(group: list[Node], samples: np.ndarray, processor: Processor) -> dict[str, NodeCost]:
    """A fused kernel's time, shared among its nodes in proportion to their roofline cost."""
    weights = np.array([roofline_ms(n, processor) for n in group]) + 1e-9
    weights /= weights.sum()
    out = {}
    for node, w in zip(group, weights):
        med, p90 = float(np.median(samples * w)), float(np.percentile(samples * w, 90))
        energy = round(med * processor.active_w, 6)  # W * ms = mJ; modelled
        out[node.name] = NodeCost(round(med, 6), round(p90, 6), MEASURED, energy, len(samples))
    return out


def _terms(worker: ThreadPoolExecutor, target: dict[str, Any], repeats: int) -> RunTerms | None:
    """The part terms of this pair (:mod:`edgesplit.profile.terms`; TVM adds no layout reorders
    at part boundaries: a library takes and returns plain tensors); None where TVM cannot build
    the micro-models."""
    run = tvm_micro_runner(worker, target, runs=repeats + 2)
    trivial = build_vm(neg_model(1), target)
    one = [np.ones(1, np.float32)]

    def call():
        vm, dev = trivial
        return busy_call(lambda: vm["main"](*[tvm_tensor(a, dev) for a in one]).numpy())

    try:
        return build_terms(run, worker, call, reorders=False, repeats=repeats)
    except Exception:  # noqa: BLE001 - TVM raises many types; the entry is still usable without terms
        return None


def tvm_tensor(a: np.ndarray, dev):
    import tvm

    return tvm.runtime.tensor(np.ascontiguousarray(a), dev)


def tvm_micro_runner(
    worker: ThreadPoolExecutor, target: dict[str, Any], runs: int = 15, warmup: int = 3
) -> MicroRunner:
    """Runs a micro-model as the runtime's TVM executor runs a part (inputs copied into TVM
    tensors, ``main``, outputs copied out, merged), on ``worker``; its kernels are TVM's own time
    evaluator (no Python around them)."""

    def on_worker(vm, dev, arrays: list[np.ndarray]):
        lock, merged = threading.Lock(), {}

        def path() -> float:
            t0 = time.perf_counter_ns()
            with busy():
                args = [tvm_tensor(a, dev) for a in arrays]
                raw = vm["main"](*args)
                outs = [v.numpy() for v in ([raw] if hasattr(raw, "numpy") else list(raw))]
                with lock:
                    merged["y"] = outs
            return (time.perf_counter_ns() - t0) / 1e6

        times = [path() for _ in range(warmup + runs)][warmup:]
        kernels = busy_call(time_vm, vm, dev, arrays, runs)
        return float(np.median(times)), float(np.median(kernels))

    def run(model: onnx.ModelProto, feeds) -> MicroRun:
        vm, dev = build_vm(model, target)
        arrays = [feeds[i.name] for i in model.graph.input]
        path_ms, kernels_ms = worker.submit(on_worker, vm, dev, arrays).result()
        return MicroRun(path_ms, kernels_ms)

    return run


def _measure_group(
    graph: ModelGraph,
    group: list[Node],
    extractor,
    target: dict[str, Any],
    threads: int | None,
    runs: int,
    rng: np.random.Generator,
    worker: ThreadPoolExecutor,
) -> list[float] | str:
    """The group's latencies in ms, or why TVM cannot run it."""
    from edgesplit.model.feeds import random_tensor

    inside = {t for n in group for t in n.outputs}
    acts = list(
        dict.fromkeys(
            t for n in group for t in n.inputs if t not in inside and not graph.tensors[t].is_weight
        )
    )
    try:
        sub = extractor.extract(acts, list(group[-1].outputs), group[0].name)
        vm, dev = build_vm(sub, target, threads)  # compiled here, timed on the processor's worker
        arrays = [
            graph.sample_inputs[t]
            if t in graph.sample_inputs
            else random_tensor(graph.tensors[t], rng)
            for t in acts
        ]
        return worker.submit(busy_call, time_vm, vm, dev, arrays, runs).result()
    except Exception as e:  # noqa: BLE001
        ops = "+".join(n.op_type for n in group)
        return f"TVM cannot import or compile {ops}: {_first_line(e)}"


class TvmProfiler:
    """The ``tvm`` entry of the profiler table: one fused kernel at a time on the Relax VM
    (:func:`profile_tvm`), with the tuned schedules the databases for the target hold.

    Each kernel is compiled, so it takes half the timed runs of ORT (at least 3).
    """

    def unavailable(self, backend: Backend) -> str | None:
        target = dict(backend.target or {"kind": "llvm"})
        return None if runs_on_this_machine(target) else f"TVM target {target} does not run here"

    def profile(self, task: ProfileTask) -> ProcessorProfile:
        runs = max(3, task.options.runs // 2)
        return profile_tvm(
            task.graph, task.processor, task.backend, runs=runs, progress=task.progress
        )
