"""Time limits of the stages: loading, simplifying, profiling and compiling one model.

A model can make any stage run for ever: a ``Loop`` whose trip count is ``10**15`` runs that long
in ONNX Runtime whether it is profiled, checked at compile or folded by onnxslim while it loads.
So each stage runs under a deadline (:func:`stage_limit`), and what it runs stops there:

* ONNX Runtime runs take :func:`run_options`, whose ``terminate`` flag is set at the deadline
  (ORT checks it between kernels, inside ``Loop`` bodies too);
* onnxslim runs in a child process that is killed at the deadline
  (:mod:`edgesplit.model.slim_worker`);
* code between those calls checks :func:`check`.

The stage then fails with :class:`StageTimeout`, one line naming the model, the stage and the flag
that sets its limit. Where a stage is still running a grace period after its deadline (a call
that takes no ``run_options``), the handler set with :func:`on_overrun` runs: the CLI's prints
that line and exits, so a command never hangs.

The limits in force are :func:`current` (defaults :class:`StageLimits`); ``with
stage_limits(profile_s=60): ...`` changes them for a block, the CLI's ``--load-timeout-s``,
``--simplify-timeout-s``, ``--profile-timeout-s`` and ``--compile-timeout-s`` for a command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from edgesplit.errors import EdgesplitError

GRACE_S = 5.0
"""How long past its deadline a stage may go on (a call that could not be stopped) before the
overrun handler runs."""

STAGES = ("load", "simplify", "profile", "compile")


@dataclass(frozen=True)
class StageLimits:
    """Seconds each stage may take for one model.

    Attributes:
        load_s: Reading, checking and shaping the model (the run that finds data-dependent shapes
            included), simplifying excluded.
        simplify_s: Folding shape computations with onnxslim, and shape inference.
        profile_s: Measuring every processor (``profile``, and ``partition``/``deploy`` without
            ``--profile``).
        compile_s: Extracting, checking and building every part, writing the bundle.
    """

    load_s: float = 600.0
    simplify_s: float = 300.0
    profile_s: float = 3600.0
    compile_s: float = 3600.0

    def __post_init__(self) -> None:
        from edgesplit.errors import InputError

        for stage in STAGES:
            v = getattr(self, f"{stage}_s")
            if not 0 < v < float("inf"):
                raise InputError(
                    f"--{stage}-timeout-s must be a positive number of seconds, not {v}"
                )


class StageTimeout(EdgesplitError):
    """A stage ran past its time limit (exit code 1)."""

    def __init__(self, where: str, stage: str, limit_s: float):
        self.where, self.stage, self.limit_s = where, stage, limit_s
        super().__init__(
            f"{where}: {stage} stopped at its time limit of {limit_s:g} s (--{stage}-timeout-s)"
        )


_lock = threading.Lock()
_limits = StageLimits()
_active: list[_Deadline] = []
_overrun: Callable[[StageTimeout], None] | None = None


def current() -> StageLimits:
    """The limits in force."""
    return _limits


def configure(limits: StageLimits) -> None:
    """Set the limits in force for this process (the CLI, from its flags)."""
    global _limits
    _limits = limits


@contextlib.contextmanager
def stage_limits(**seconds: float) -> Iterator[StageLimits]:
    """The limits in force changed for a block: ``with stage_limits(profile_s=60): ...``."""
    before = _limits
    configure(dataclasses.replace(before, **seconds))
    try:
        yield _limits
    finally:
        configure(before)


def on_overrun(handler: Callable[[StageTimeout], None] | None) -> None:
    """Call ``handler`` for a stage still running :data:`GRACE_S` after its deadline."""
    global _overrun
    _overrun = handler


class _Deadline:
    def __init__(self, stage: str, limit_s: float, where: str):
        self.error = StageTimeout(where, stage, limit_s)
        self.ends = time.monotonic() + limit_s
        self.expired = False
        self.options: weakref.WeakSet = weakref.WeakSet()
        self._timers = [
            threading.Timer(limit_s, self._expire),
            threading.Timer(limit_s + GRACE_S, self._overran),
        ]
        for t in self._timers:
            t.daemon = True

    def start(self) -> None:
        for t in self._timers:
            t.start()

    def stop(self) -> None:
        for t in self._timers:
            t.cancel()

    def remaining_s(self) -> float:
        return max(0.0, self.ends - time.monotonic())

    def _expire(self) -> None:
        with _lock:
            self.expired = True
            for ro in list(self.options):
                ro.terminate = True

    def _overran(self) -> None:
        handler = _overrun
        if handler is not None:
            handler(self.error)


@contextlib.contextmanager
def stage_limit(stage: str, where: str, limit_s: float | None = None) -> Iterator[_Deadline]:
    """Run a block as ``stage`` of the model ``where``, within ``limit_s`` (default the limit in
    force). An error raised after the deadline passed becomes :class:`StageTimeout`, as does a
    block that ends after it."""
    limit = getattr(_limits, f"{stage}_s") if limit_s is None else limit_s
    d = _Deadline(stage, limit, where)
    with _lock:
        _active.append(d)
    d.start()
    try:
        yield d
    except StageTimeout:
        raise
    except Exception as e:
        if d.expired:
            raise d.error from e
        raise
    finally:
        d.stop()
        with _lock:
            _active.remove(d)
    if d.expired:
        raise d.error


def run_options():
    """An ``onnxruntime.RunOptions`` whose ``terminate`` is set when a stage running now reaches
    its deadline (at once, where one has). Pass it to every ``InferenceSession.run`` of a stage.
    Its run logs nothing: a run that fails raises, and edgesplit's one-line error says why."""
    import onnxruntime as ort

    ro = ort.RunOptions()
    ro.log_severity_level = 4  # ORT's own line for a failed kernel would come beside ours
    with _lock:
        for d in _active:
            d.options.add(ro)
            if d.expired:
                ro.terminate = True
    return ro


class StoppableSession:
    """An ``onnxruntime.InferenceSession`` whose ``run`` takes :func:`run_options` unless given
    its own: a stage's deadline stops it (everything else is the session's)."""

    def __init__(self, session):
        self.session = session

    def run(self, output_names, input_feed, options=None):
        return self.session.run(output_names, input_feed, options or run_options())

    def __getattr__(self, name: str):
        return getattr(self.session, name)


def check() -> None:
    """Raise :class:`StageTimeout` where a stage running now has passed its deadline."""
    with _lock:
        late = next((d for d in _active if d.expired), None)
    if late is not None:
        raise late.error


def remaining_s() -> float | None:
    """Seconds until the nearest deadline of the stages running now (None: none runs)."""
    with _lock:
        return min((d.remaining_s() for d in _active), default=None)


def nearest_error() -> StageTimeout | None:
    """The error of the stage running now whose deadline comes first: what to raise when a wait
    of :func:`remaining_s` ran out."""
    with _lock:
        return min(_active, key=lambda d: d.ends).error if _active else None
