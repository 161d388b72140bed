"""Run-time adaptation: measure the link, and choose per remote part between server and device.

What is built (the "simplest honest version"): the bundle's plan was made for one bandwidth; at
run time each remote part compares two estimates and takes the faster one:

* remote: the part's own measured round trip (exponentially weighted: shapes are static, so its
  payload never changes); before the part has been sent once, ``rtt_ms + nbytes * 8 / bandwidth``
  from a :class:`LinkEstimator` fed by every transfer the executors make anyway and a few health
  pings, shared by the parts that talk to the same server;
* local: the measured time of the part's local fallback artifact (one calibration run at load).

Shapes are static, so a part's payload ``nbytes`` is fixed and the choice reduces to comparing
these two numbers, with a 10 % hysteresis so that noise does not flap it. While the part runs
locally the server's side goes stale, so it is probed with a real request now and then; each
probe that confirms the local choice doubles the interval (1 s up to 30 s), so a bad link costs
little, and one whose round trip moved by more than ``PROBE_MARGIN`` from the probe before (the
link is changing, though not yet enough to switch) sets it back to 1 s, so that the change is
followed. Every estimate here is measured; nothing is taken from the plan except where no
measurement exists yet.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

PROBE_MARGIN = 1.5  # a probe's round trip this many times the one before (or 1/x): the link moved


@dataclass(frozen=True)
class LinkEstimate:
    """What the link looks like so far.

    Attributes:
        rtt_ms: Round-trip time (smallest recent health-ping time), None before any ping.
        bandwidth_mbps: Link rate: bytes over the wire time of the recent transfers, with the RTT
            and the server's own time taken out; None before a ping and a transfer.
        goodput_mbps: All bytes moved over all transfer time (RTT included): what requests got.
        transfers: Transfers seen.
        nbytes: Bytes moved both ways.
    """

    rtt_ms: float | None
    bandwidth_mbps: float | None
    goodput_mbps: float | None
    transfers: int
    nbytes: int

    def transfer_ms(self, nbytes: int) -> float | None:
        """Predicted time to move ``nbytes`` (both ways together) in one exchange, or None."""
        if self.rtt_ms is None or self.bandwidth_mbps is None:
            return None
        return self.rtt_ms + nbytes * 8 / (self.bandwidth_mbps * 1e3)


class LinkEstimator:
    """Thread-safe link measurements from pings and transfers (the last ``window`` of each)."""

    def __init__(self, window: int = 16):
        self._pings: deque[float] = deque(maxlen=window)
        self._recent: deque[tuple[int, float, int]] = deque(
            maxlen=window
        )  # (nbytes, ms, up nbytes)
        self._nbytes = 0
        self._transfer_ms = 0.0
        self._transfers = 0
        self._last_transfer = float("-inf")
        self._lock = threading.Lock()

    def add_ping(self, rtt_ms: float) -> None:
        with self._lock:
            self._pings.append(rtt_ms)

    def add_transfer(
        self, nbytes: int, elapsed_ms: float, server_ms: float, up_nbytes: int | None = None
    ) -> None:
        """One exchange: ``nbytes`` both ways (``up_nbytes`` of them sent, when known) in
        ``elapsed_ms``, of which the server took ``server_ms``."""
        transfer_ms = max(elapsed_ms - server_ms, 1e-3)
        with self._lock:
            self._nbytes += nbytes
            self._transfer_ms += transfer_ms
            self._transfers += 1
            self._last_transfer = time.monotonic()
            self._recent.append((nbytes, transfer_ms, nbytes if up_nbytes is None else up_nbytes))

    @property
    def last_transfer(self) -> float:
        """``time.monotonic()`` of the last transfer (``-inf`` before any)."""
        return self._last_transfer

    def uplink_mbps(self, down_ratio: float = 1.0, min_nbytes: int = 64_000) -> float | None:
        """The uplink rate implied by the newest transfers, for a downlink ``down_ratio`` times as
        fast: each moved ``up`` bytes out and ``down`` back in ``wire = (up + down / ratio) * 8 /
        rate``
        (the RTT and the server's time taken out). It takes transfers from the newest back until
        they hold ``min_nbytes`` (a small one alone says more about the RTT's jitter than about the
        rate), so that it follows a change within a request or two. None before a ping and a
        transfer."""
        with self._lock:
            if not self._pings or not self._recent:
                return None
            rtt = min(self._pings)
            recent = list(self._recent)
        wire_ms = weighted = 0.0
        for n, ms, up in reversed(recent):
            wire_ms += max(ms - rtt, 1e-3)
            weighted += up + (n - up) / down_ratio
            if weighted >= min_nbytes:
                break
        return weighted * 8 / (wire_ms * 1e3)

    def estimate(self) -> LinkEstimate:
        with self._lock:
            goodput = (
                self._nbytes * 8 / (self._transfer_ms * 1e3) if self._transfer_ms > 0 else None
            )
            rtt = min(self._pings) if self._pings else None
            bw = None
            if rtt is not None and self._recent:
                # A ratio of sums over recent transfers: robust to the jitter of any single one.
                wire_ms = sum(max(ms - rtt, 1e-3) for _, ms, _ in self._recent)
                bw = sum(n for n, _, _ in self._recent) * 8 / (wire_ms * 1e3)
            return LinkEstimate(rtt, bw, goodput, self._transfers, self._nbytes)


class OffloadPolicy:
    """Chooses ``"remote"`` or ``"local"`` for one part from measured costs (see the module doc)."""

    def __init__(
        self,
        nbytes: int,
        local_ms: float | None,
        *,
        hysteresis: float = 0.1,
        probe_interval_s: float = 1.0,
        max_probe_interval_s: float = 30.0,
    ):
        self.nbytes = nbytes
        self.local_ms = local_ms
        self.hysteresis = hysteresis
        self.base_probe_s = probe_interval_s
        self.max_probe_s = max_probe_interval_s
        self.probe_s = probe_interval_s
        self.mode = "remote"
        self.switches = 0
        self._remote_ms: float | None = None
        self._server_ms: float | None = None
        self._last_remote = float("-inf")
        self._lock = threading.Lock()

    def remote_estimate_ms(self, link: LinkEstimate) -> float | None:
        if self._remote_ms is not None:
            return self._remote_ms  # this very payload, measured: the best predictor there is
        wire = link.transfer_ms(self.nbytes)
        return None if wire is None else wire + (self._server_ms or 0.0)

    def choose(self, link: LinkEstimate, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        with self._lock:
            remote, local = self.remote_estimate_ms(link), self.local_ms
            if remote is None or local is None:
                return "remote"  # learn the remote cost first; the local one is calibrated at load
            want = self.mode
            if self.mode == "remote" and remote > local * (1 + self.hysteresis):
                want = "local"
            elif self.mode == "local" and remote < local * (1 - self.hysteresis):
                want = "remote"
            if want != self.mode:
                self.mode, self.switches, self.probe_s = want, self.switches + 1, self.base_probe_s
                if want == "local":
                    self._last_remote = now  # the estimate that made us switch is fresh
            if self.mode == "local" and now - self._last_remote >= self.probe_s:
                self.probe_s = min(self.probe_s * 2, self.max_probe_s)
                self._last_remote = now  # one probe at a time
                return "remote"
            return self.mode

    def observed_remote(self, total_ms: float, server_ms: float, now: float | None = None) -> None:
        with self._lock:
            self._last_remote = time.monotonic() if now is None else now
            a = 0.3
            if self._remote_ms is None or self.mode == "local":
                before = self._remote_ms
                if (
                    before
                    and self.mode == "local"
                    and max(total_ms / before, before / total_ms) > PROBE_MARGIN
                ):
                    self.probe_s = self.base_probe_s  # the link is moving: look again soon
                self._remote_ms = (
                    total_ms  # a probe: fresh news about a stale estimate, not one more sample
                )
            else:
                self._remote_ms = (1 - a) * self._remote_ms + a * total_ms
            self._server_ms = (
                server_ms if self._server_ms is None else (1 - a) * self._server_ms + a * server_ms
            )

    def observed_local(self, ms: float) -> None:
        with self._lock:
            a = 0.3
            self.local_ms = ms if self.local_ms is None else (1 - a) * self.local_ms + a * ms
