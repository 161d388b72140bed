"""The remote executor: runs a server part over OIP v2, falling back to its local artifact.

Contract (as for every executor, see ``executors.py``): ``run`` takes a dict holding at least the
part's inputs and returns exactly the part's outputs, with their declared shapes and dtypes. It
never hangs: each call to the server has one deadline (``timeout_s``) covering connect, retries
with backoff, send and receive. When the server cannot be reached, breaks off, answers 5xx, is
slower than the deadline, or returns outputs of the wrong shape or dtype, the part runs on its
local fallback (``PartArtifact.fallback``, an ORT model on a device CPU); without one it raises
:class:`~edgesplit.errors.RemoteError`. A 4xx answer (a wrong token, a wrong server) is a
configuration error and is raised (:class:`~edgesplit.errors.RemoteHostError`, exit code 2), not
hidden by the fallback.

After a failure the server is left alone for a cool-down (0.5 s doubling to 15 s) during which
calls go straight to the fallback, so a dead server costs one deadline, not one per request.

Options (``load(bundle, executor_options={"remote": {...}})``): ``url``, ``token``,
``timeout_s`` (the overall deadline of one call; ``run --deadline-ms``), ``connect_timeout_s``,
``retries``, ``backoff_s``, ``fallback`` (False to forbid it), ``adaptive`` (see
:mod:`edgesplit.runtime.adaptive`). An answer larger than the part's outputs can be (8x their
binary size, plus 1 MB for the header) is refused before it is read, and falls back like any
failure.
The local fallback executor is built by the executor table
(:func:`edgesplit.runtime.backends.remote_executor`) and handed in as ``local``, so this module
needs no other executor.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgesplit.bundle.format import PartArtifact
from edgesplit.errors import RemoteError, RemoteHostError
from edgesplit.runtime.adaptive import LinkEstimator, OffloadPolicy
from edgesplit.runtime.client import OipClient
from edgesplit.runtime.executors import Executor
from edgesplit.runtime.oip import served_name

_LINKS: dict[str, LinkEstimator] = {}
_LINKS_LOCK = threading.Lock()


def link_for(url: str) -> LinkEstimator:
    """The link estimator shared by every executor that talks to ``url``."""
    with _LINKS_LOCK:
        return _LINKS.setdefault(url, LinkEstimator())


@dataclass(frozen=True)
class RemoteStats:
    """What a remote part did so far.

    Attributes:
        remote_runs / local_runs: Runs answered by the server / by the local fallback.
        failures: Calls to the server that failed (each then fell back or raised).
        retries: Extra attempts the successful calls needed.
        sent_nbytes / received_nbytes: HTTP bytes of the successful calls.
        rtt_ms, bandwidth_mbps, goodput_mbps: The measured link (see ``LinkEstimate``).
        server_ms_median: The server's own time per request (median of the last 1000).
        remote_ms_median: Whole remote calls as this device saw them (median of the last 1000).
        compute_ms_median: The part's compute on the server per request (``Server-Timing``
            compute; median of the last 1000): ``remote_ms_median`` less it is what the call
            itself cost (the server's HTTP handling and queue, the wire, this client).
        mode: ``remote``, ``local`` (no server configured), or ``adaptive:remote|local``.
    """

    part: str
    url: str | None
    remote_runs: int
    local_runs: int
    failures: int
    retries: int
    sent_nbytes: int
    received_nbytes: int
    rtt_ms: float | None
    bandwidth_mbps: float | None
    goodput_mbps: float | None
    server_ms_median: float | None
    remote_ms_median: float | None
    local_ms_median: float | None
    mode: str
    last_error: str | None
    compute_ms_median: float | None = None


class RemoteExecutor:
    """Runs one ``remote=True`` part on an OIP v2 server (``edgesplit serve`` or Triton)."""

    def __init__(
        self,
        part: PartArtifact,
        *,
        local: Executor | None = None,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 1.0,
        retries: int = 2,
        backoff_s: float = 0.05,
        adaptive: bool = False,
        cooldown_s: float = 0.5,
        max_cooldown_s: float = 15.0,
        probe_interval_s: float = 1.0,
        model_prefix: str = "",
    ):
        """``model_prefix``: the server names this part's model ``<prefix>_<part>`` (a fleet's
        Triton repository, ``serve --model-prefix``); empty: the part's own name."""
        self.part = part
        self.url = url
        self.model_name = served_name(part.name, model_prefix)
        self._inputs = [t.name for t in part.inputs]
        self._outputs = {t.name: t for t in part.outputs}
        self._lock = threading.Lock()
        self._local = local
        if url is None and self._local is None:
            raise RemoteError(
                f"part {part.name} runs on a server, but no server URL was given "
                f"(--server URL, or executor_options={{'remote': {{'url': ...}}}}) "
                f"and it has no local fallback"
            )
        self._client = (
            None
            if url is None
            else OipClient(
                url,
                token=token,
                connect_timeout_s=connect_timeout_s,
                timeout_s=timeout_s,
                retries=retries,
                backoff_s=backoff_s,
                max_response_nbytes=8 * _nbytes(part.outputs) + (1 << 20),
            )
        )
        self._link = link_for(url) if url else LinkEstimator()
        self._cooldown = (cooldown_s, max_cooldown_s)
        self._next_cooldown = cooldown_s
        self._down_until = 0.0
        self._counts = {
            "remote": 0,
            "local": 0,
            "failures": 0,
            "retries": 0,
            "sent": 0,
            "received": 0,
        }
        self._server_ms: deque[float] = deque(maxlen=1000)
        self._remote_ms: deque[float] = deque(maxlen=1000)
        self._local_ms: deque[float] = deque(maxlen=1000)
        self._compute_ms: deque[float] = deque(maxlen=1000)
        self._last_error: str | None = (
            None if url else "no server URL given: running on the local fallback"
        )
        self._policy: OffloadPolicy | None = None
        if self._client is not None:
            self._probe_rtt()
        if adaptive and self._client is not None and self._local is not None:
            nbytes = _nbytes(part.inputs) + _nbytes(part.outputs)
            self._policy = OffloadPolicy(
                nbytes, self._calibrate_local(), probe_interval_s=probe_interval_s
            )

    def _probe_rtt(self, n: int = 3) -> None:
        assert self._client is not None
        for _ in range(n):
            try:
                self._link.add_ping(self._client.ping(timeout_s=self._client.connect_timeout_s))
            except RemoteError as e:
                self._trip(e)
                return

    def _calibrate_local(self) -> float:
        assert self._local is not None
        feeds = {t.name: np.zeros(t.shape, dtype=t.dtype) for t in self.part.inputs}
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            self._local.run(feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        return times[-1]

    # ---- running

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ins = {k: feeds[k] for k in self._inputs}
        if self._client is None:
            return self._run_local(ins)
        if self._policy is not None and self._policy.choose(self._link.estimate()) == "local":
            return self._run_local(ins)
        if time.monotonic() < self._down_until:
            if self._local is not None:
                return self._run_local(ins)
            raise RemoteError(
                f"part {self.part.name}: server {self.url} is unavailable ({self._last_error}); "
                f"retrying in {self._down_until - time.monotonic():.1f} s"
            )
        t0 = time.perf_counter()
        try:
            out, ex = self._client.infer(self.model_name, ins, list(self._outputs))
            self._check(out)
        except RemoteError as e:
            status = getattr(e, "status", None)
            if (
                status is not None and 400 <= status < 500
            ):  # the server refuses us: bad configuration
                raise RemoteHostError(f"part {self._called()}: {e}") from e
            self._trip(e)
            if self._local is not None:
                return self._run_local(ins)
            raise RemoteError(f"part {self.part.name}: {e}") from e
        total_ms = (time.perf_counter() - t0) * 1e3
        self._link.add_transfer(
            ex.sent_nbytes + ex.received_nbytes,
            ex.elapsed_ms,
            ex.server_ms,
            up_nbytes=ex.sent_nbytes,
        )
        if self._policy is not None:
            self._policy.observed_remote(total_ms, ex.server_ms)
        with self._lock:
            c = self._counts
            c["remote"] += 1
            c["retries"] += ex.attempts - 1
            c["sent"] += ex.sent_nbytes
            c["received"] += ex.received_nbytes
            self._server_ms.append(ex.server_ms)
            self._compute_ms.append(ex.compute_ms)
            self._remote_ms.append(total_ms)
            self._next_cooldown = self._cooldown[0]
        return out

    @property
    def available(self) -> bool:
        """False while a server is configured but in its cool-down after a failure."""
        return self._client is not None and time.monotonic() >= self._down_until

    @property
    def link(self) -> LinkEstimator:
        return self._link

    def _called(self) -> str:
        """The part, and the server's name for it when that is another."""
        if self.model_name == self.part.name:
            return self.part.name
        return f"{self.part.name} (model {self.model_name} on the server)"

    def probe(self) -> bool:
        """Send the part's zero inputs to the server to measure the link (not counted as a run);
        True when it answered. A failure starts the cool-down, as a failed run does."""
        if self._client is None or not self.available:
            return False
        feeds = {t.name: np.zeros(t.shape, dtype=t.dtype) for t in self.part.inputs}
        try:
            self._link.add_ping(self._client.ping(timeout_s=self._client.connect_timeout_s))
            out, ex = self._client.infer(self.model_name, feeds, list(self._outputs))
            self._check(out)
        except RemoteError as e:
            self._trip(e)
            return False
        self._link.add_transfer(
            ex.sent_nbytes + ex.received_nbytes,
            ex.elapsed_ms,
            ex.server_ms,
            up_nbytes=ex.sent_nbytes,
        )
        return True

    def _check(self, out: Mapping[str, np.ndarray]) -> None:
        """A server must answer exactly the part's outputs, with their shapes and dtypes."""
        for name, spec in self._outputs.items():
            arr = out.get(name)
            if (
                arr is None
                or tuple(arr.shape) != tuple(spec.shape)
                or arr.dtype != np.dtype(spec.dtype)
            ):
                got = "nothing" if arr is None else f"{arr.dtype}{list(arr.shape)}"
                raise RemoteError(
                    f"server {self.url} answered {got} for output '{name}' of part "
                    f"{self.part.name}, expected {spec.dtype}{list(spec.shape)}"
                )

    def _trip(self, e: RemoteError) -> None:
        with self._lock:
            self._counts["failures"] += 1
            self._last_error = str(e)
            self._down_until = time.monotonic() + self._next_cooldown
            self._next_cooldown = min(self._next_cooldown * 2, self._cooldown[1])

    def _run_local(self, ins: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._local is not None
        t0 = time.perf_counter()
        out = self._local.run(ins)
        ms = (time.perf_counter() - t0) * 1e3
        if self._policy is not None:
            self._policy.observed_local(ms)
        with self._lock:
            self._counts["local"] += 1
            self._local_ms.append(ms)
        return out

    # ---- reporting

    @property
    def executed_by(self) -> str:
        remote, local = self._counts["remote"], self._counts["local"]
        if local == 0:
            return "remote"
        if remote == 0:
            return "ort-fallback"
        return f"remote ({remote} runs) + ort-fallback ({local} runs)"

    def stats(self) -> RemoteStats:
        link = self._link.estimate()
        with self._lock:
            c = dict(self._counts)
            med = [
                float(np.median(d)) if d else None
                for d in (self._server_ms, self._remote_ms, self._local_ms, self._compute_ms)
            ]
            last_error = self._last_error
        if self._client is None:
            mode = "local"
        elif self._policy is not None:
            mode = f"adaptive:{self._policy.mode}"
        else:
            mode = "remote"
        return RemoteStats(
            self.part.name,
            self.url,
            c["remote"],
            c["local"],
            c["failures"],
            c["retries"],
            c["sent"],
            c["received"],
            link.rtt_ms,
            link.bandwidth_mbps,
            link.goodput_mbps,
            med[0],
            med[1],
            med[2],
            mode,
            last_error,
            med[3],
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._local is not None:
            self._local.close()


def _nbytes(specs) -> int:
    return sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in specs)
