"""Helpers around a Session for the CLI and benchmarks: inputs from files, timing reports."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesplit.bundle.format import TensorSpec
from edgesplit.errors import RunInputError
from edgesplit.runtime.breakdown import Breakdown, breakdown, plan_value
from edgesplit.runtime.session import Session, SessionStats, load
from edgesplit.runtime.trace import Trace
from edgesplit.util import atomic_write_bytes

__all__ = ["load", "read_inputs", "random_feeds", "benchmark", "RunReport"]


def random_feeds(
    sess: Session, seed: int = 0, given: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """The bundle's inputs: those ``given`` (``--input``), the others made up (seeded), within the
    bounds of the ops that read them in its parts (indices within an axis ...:
    :mod:`edgesplit.model.bounds`).

    Raises:
        RunInputError: for an input no value can be made up for (a sequence); pass its value.
    """
    import onnx

    from edgesplit.model.bounds import model_bounds
    from edgesplit.model.feeds import random_tensor
    from edgesplit.model.graph import TensorInfo

    given = dict(given or {})
    names = {t.name for t in sess.input_specs} - set(given)
    bounds: dict = {}
    for part in sess.manifest.parts:
        reads = [t.name for t in part.inputs if t.name in names]
        if reads:
            found = model_bounds(
                onnx.load_model_from_string(sess.bundle.read(part.onnx_file)), reads
            )
            for t, b in found.items():  # None: a rule no value meets, in any part
                bounds[t] = (
                    b
                    if t not in bounds
                    else None
                    if b is None or bounds[t] is None
                    else bounds[t].meet(b)
                )
    rng = np.random.default_rng(seed)
    made = {
        t.name: random_tensor(
            TensorInfo(t.name, t.shape, t.dtype, 0, kind=t.kind), rng, bounds.get(t.name)
        )
        for t in sess.input_specs
        if t.name in names
    }
    return {**made, **given}


def stream_period_ms(sess: Session, feeds: dict[str, np.ndarray], k: int) -> float:
    """A stream's period in its steady state (ms per request): ``k`` results timed after as many
    results as the stream keeps in flight (it has filled) and while as many requests again are
    still to come (it is not draining). With results timed from the start or to the end, a window
    larger than the stream times a batch instead: every request queued at once, each worker then
    running one part after another without the others' parts between them."""
    w = sess.stream_window
    stamps = [
        time.perf_counter() for _ in sess.run_stream(feeds for _ in range(stream_requests(sess, k)))
    ]
    return (stamps[w + k - 1] - stamps[w - 1]) * 1e3 / k


def stream_requests(sess: Session, k: int) -> int:
    """Requests :func:`stream_period_ms` runs to time ``k``."""
    return 2 * sess.stream_window + k


def read_inputs(sess: Session, specs: Sequence[str]) -> dict[str, np.ndarray]:
    """``NAME=FILE.npy`` strings -> arrays; inputs not given are random (seeded).

    Raises:
        RunInputError: naming the flag or the file: not ``NAME=FILE``, an input the bundle does not
            take, or a file that is not a plain ``.npy`` array of the input's shape and dtype.
    """
    feeds = random_feeds(sess)
    expected = {t.name: t for t in sess.input_specs}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise RunInputError(f"--input '{spec}' is not NAME=FILE.npy")
        if name not in expected:
            raise RunInputError(
                f"--input {name}: the bundle has no input '{name}' (inputs: {', '.join(expected)})"
            )
        feeds[name] = read_npy(path, expected[name])
    return feeds


def read_npy(path: str | os.PathLike, spec: TensorSpec) -> np.ndarray:
    """A ``.npy`` file holding an array of ``spec``'s shape and dtype.

    The header is read and checked first, so a file that claims a huge shape, or holds Python
    objects (pickles are never loaded), is refused before its data is read.
    """
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise RunInputError(f"{path}: cannot read the input ({e.strerror})") from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(
        mode
    ):  # before fdopen, which refuses a directory with an error naming the fd
        os.close(fd)
        raise RunInputError(
            f"{path}: "
            + ("is a directory, not a .npy file" if stat.S_ISDIR(mode) else "not a regular file")
        )
    with os.fdopen(fd, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_{version[1]}")
            shape, _, dtype = read_header(f)
        except (ValueError, OSError, AttributeError, SyntaxError) as e:
            raise RunInputError(f"{path}: not a .npy array ({e})") from e
        if dtype.hasobject:
            raise RunInputError(f"{path}: holds Python objects (a pickle), which are never loaded")
        if not spec.fits(shape):
            raise RunInputError(
                f"{path}: input '{spec.name}': shape {tuple(shape)}, expected {tuple(spec.shown())}"
            )
        if dtype != np.dtype(spec.dtype):
            raise RunInputError(
                f"{path}: input '{spec.name}': dtype {dtype}, expected {spec.dtype}"
            )
        f.seek(0)
        try:
            return np.load(f, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise RunInputError(f"{path}: not a readable .npy array ({e})") from e


@dataclass(frozen=True)
class RunReport:
    """What :func:`benchmark` measured.

    Attributes:
        trace: The timing records of the timed requests (single requests, then the stream's).
        breakdown: Where the time went in the single requests (the stream's are left out: their
            queue waits measure the pipelining, not the plan's latency).
    """

    stats: SessionStats
    runs: int
    median_ms: float
    p90_ms: float
    predicted_ms: float | None
    predicted_per_s: float | None
    remote: dict
    stream_n: int
    stream_per_s: float | None
    outputs: dict[str, np.ndarray]
    trace: Trace | None = None
    breakdown: Breakdown | None = None

    def save_outputs(self, folder: str | os.PathLike) -> None:
        save_arrays(self.outputs, folder)


def save_arrays(arrays: dict[str, np.ndarray], folder: str | os.PathLike) -> None:
    """Each array as ``NAME.npy`` in ``folder`` (written atomically)."""
    import io

    for name, arr in arrays.items():
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        atomic_write_bytes(Path(folder) / f"{name.replace('/', '_')}.npy", buf.getvalue())


def single_requests_ms(sess: Session, feeds: dict[str, np.ndarray], n: int) -> list[float]:
    """``n`` requests one after another, each timed alone (ms)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sess.run(feeds)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def benchmark(
    sess: Session,
    feeds: dict[str, np.ndarray],
    *,
    repeat: int = 20,
    warmup: int = 3,
    stream: int = 0,
) -> RunReport:
    """Time ``repeat`` single requests (after ``warmup``), then optionally a stream of ``stream``.

    With a Session loaded with ``detailed=True``, ORT's profiler is stopped at the end and
    its kernels are in the report's trace and breakdown.
    """
    outputs = sess.run(feeds)
    for _ in range(max(0, warmup - 1)):
        sess.run(feeds)
    sess.reset_stats()
    lat = single_requests_ms(sess, feeds, repeat)
    stats = sess.stats()
    singles = {r.request for r in sess.trace_records().requests}
    per_s = None
    if stream:  # ``stream`` requests timed in the steady state (see stream_period_ms)
        per_s = 1e3 / stream_period_ms(sess, feeds, stream)
    trace = sess.end_detailed_trace() if sess.detailed else sess.trace_records()
    predicted = plan_value(sess.manifest.plan, "predicted") or {}
    return RunReport(
        stats,
        repeat,
        float(np.median(lat)),
        float(np.percentile(lat, 90)),
        plan_value(predicted, "latency_ms"),
        plan_value(predicted, "throughput_per_s"),
        sess.remote_stats(),
        stream,
        per_s,
        outputs,
        trace,
        breakdown(trace.select(singles), sess.manifest),
    )
