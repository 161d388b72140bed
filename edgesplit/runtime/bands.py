"""Switching plans at run time: an adaptive bundle's band plans, chosen from the measured link.

An adaptive bundle (``Manifest.bands``) holds a plan per band of uplink rates. A
:class:`BandSession` loads one :class:`~edgesplit.runtime.session.Session` per band plan (so a
switch costs nothing at request time) and, **between requests**, picks the plan of the band the
measured uplink rate falls in; a request runs wholly in the plan chosen before it started, so no
request mixes two plans.

The rate comes from the link estimator every remote part of every plan feeds with its own
transfers (:class:`~edgesplit.runtime.adaptive.LinkEstimator`: pings give the RTT; each exchange's
bytes over its time with the RTT and the server's time taken out give the rate, the downlink
weighed by the band table's down/up ratio). Every real transfer is a measurement, so while the plan
in use sends, the choice before the next request already sees a change. When the plan in use sends
nothing (a device-only band), the link goes unmeasured, so a background thread probes it: one
remote part of the next faster band's plan sent with zero inputs, when the link has been quiet for
the probe interval. Probes go out only between requests (a probe's own work would slow a starved
device's request), unless no request gap has let one out for twice the interval; never while
the plan in use sends (its transfers measure the link, and a probe would queue on the server before
the next request). The interval (:class:`ProbeClock`) starts at ``probe_interval_s`` and doubles up
to ``max_probe_interval_s`` while measurements agree with the estimate they follow; it goes back to
the start after a switch, and whenever a probe's measure disagrees with the estimate before it by
more than the hysteresis margin: the link is moving, so look again soon. A probe that started before
a rate change and ended after it measures a mixture; it
disagrees with the old estimate, so the next probe follows at once.

Hysteresis: the plan changes only when the rate is more than a factor ``1 + hysteresis`` inside a
band of another plan (beyond every band of the current one). While a server is in its cool-down
after a failure, the lowest band's plan (the one that sends least) runs, so a dead server costs one
failed request, whose remote parts ran on their local fallback.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from edgesplit.bundle.format import BundleBands, open_bundle
from edgesplit.errors import BundleError
from edgesplit.runtime.session import Session


@dataclass(frozen=True)
class Switch:
    """A change of plan before request ``request`` (numbered from 0 since load): the first request
    to run on ``to_plan``."""

    request: int
    from_plan: int
    to_plan: int
    uplink_mbps: float | None
    reason: str


@dataclass(frozen=True)
class BandStats:
    """What a :class:`BandSession` did.

    Attributes:
        plan_ms: Per plan: wall time of the requests it ran (ms).
        plan_requests: Per plan: requests it ran.
        decision_us_median / decision_us_p99 / decision_us_max: Time to choose a plan before a
            request (µs, over the last 10,000 choices).
        uplink_mbps, rtt_ms: The link as last measured (None before any measure).
        probes: Link probes sent while idle.
    """

    current: int
    switches: tuple[Switch, ...]
    plan_ms: tuple[float, ...]
    plan_requests: tuple[int, ...]
    decision_us_median: float
    decision_us_p99: float
    decision_us_max: float
    uplink_mbps: float | None
    rtt_ms: float | None
    probes: int


class ProbeClock:
    """When to probe an idle link (pure: no I/O). See the module doc.

    ``interval_s`` starts at ``base_s``; :meth:`observed` doubles it (up to ``max_s``) when a new
    estimate agrees with the one before within a factor ``margin``, and resets it to ``base_s``
    when it does not (or :meth:`reset`, after a switch).
    """

    def __init__(self, base_s: float, max_s: float, margin: float):
        self.base_s, self.max_s, self.margin = base_s, max(max_s, base_s), margin
        self.interval_s = base_s
        self.last_probe = float("-inf")  # time.monotonic() of the last probe sent

    def reset(self) -> None:
        self.interval_s = self.base_s

    def disagree(self, before_mbps: float | None, after_mbps: float | None) -> bool:
        """True when the two estimates differ by more than the margin (a first estimate counts)."""
        if after_mbps is None:
            return False
        if before_mbps is None:
            return True
        return max(after_mbps / before_mbps, before_mbps / after_mbps) > self.margin

    def observed(self, before_mbps: float | None, after_mbps: float | None) -> bool:
        """A new estimate after a probe; returns whether it disagreed (the interval reset)."""
        if self.disagree(before_mbps, after_mbps):
            self.reset()
            return True
        self.interval_s = min(self.interval_s * 2, self.max_s)
        return False

    def due(self, now: float, last_transfer: float, busy: bool, plan_sends: bool) -> bool:
        """Whether to probe now: the plan in use sends nothing, the link has been quiet (no
        transfer,
        no probe) for the interval, and no request runs, or none has let a probe out for twice the
        interval (a stream with no gaps)."""
        quiet_s = now - max(self.last_probe, last_transfer)
        if plan_sends or quiet_s < self.interval_s:
            return False
        return not busy or quiet_s >= 2 * self.interval_s


class BandSelector:
    """The plan for a measured uplink rate, with hysteresis (pure: no I/O, microseconds)."""

    def __init__(self, bands: BundleBands, hysteresis: float = 0.15):
        self.bands = bands
        self.factor = 1.0 + hysteresis

    def choose(self, current: int, uplink_mbps: float | None) -> int:
        if uplink_mbps is None:
            return current
        want = self.bands.plan_at(uplink_mbps)
        if want == current:
            return current
        near = (
            self.bands.plan_at(uplink_mbps / self.factor),
            self.bands.plan_at(uplink_mbps * self.factor),
        )
        return current if current in near else want

    def lowest(self) -> int:
        return int(self.bands.bands[0]["plan"])

    def next_faster(self, current: int) -> int | None:
        """The plan of the first band above the current plan's highest band (None: none above)."""
        bands = self.bands.bands
        top = max((i for i, b in enumerate(bands) if b["plan"] == current), default=-1)
        return int(bands[top + 1]["plan"]) if top + 1 < len(bands) else None


class BandSession:
    """Runs an adaptive bundle, switching band plans between requests (see the module doc).

    Keyword arguments go to each :class:`Session` (``executor_options`` with the server's
    ``url``, ``detailed``...). Without a server URL every plan's remote parts run on their local
    fallbacks and the session stays on the default plan.
    """

    def __init__(
        self,
        bundle: str | os.PathLike,
        *,
        hysteresis: float = 0.15,
        probe_interval_s: float | None = 1.0,
        max_probe_interval_s: float = 30.0,
        start_plan: int | None = None,
        **session_options,
    ):
        manifest = open_bundle(bundle, trust_key=session_options.get("trust_key"))
        if manifest.bands is None:
            raise BundleError(
                f"{bundle}: the bundle has no band table (compile it with a server, without "
                "--no-bands)"
            )
        self.bands: BundleBands = manifest.bands
        self.selector = BandSelector(self.bands, hysteresis)
        session_options.pop("adaptive", None)  # the plan choice replaces the per-part one
        self.sessions = [
            Session(bundle, band_plan=k, verify=False, **session_options)
            for k in range(len(self.bands.plans))
        ]
        self.manifest = self.sessions[0].manifest
        self.current = self.selector.lowest() if start_plan is None else start_plan
        self.last_plan: int | None = None  # the plan the last request ran on
        self._remote = [
            [ex for ex in s.remote_executors() if hasattr(ex, "probe")] for s in self.sessions
        ]
        self._link_list = list(
            {id(ex.link): ex.link for exs in self._remote for ex in exs}.values()
        )
        self._switches: list[Switch] = []
        self._plan_ms = [0.0] * len(self.sessions)
        self._plan_requests = [0] * len(self.sessions)
        self._decision_us: deque[float] = deque(maxlen=10_000)
        self._requests = 0
        self._choice_lock = threading.Lock()
        self._busy = threading.Lock()  # held while a request runs
        self._probes = 0
        self.clock = ProbeClock(probe_interval_s or 1.0, max_probe_interval_s, 1.0 + hysteresis)
        self._paused = threading.Event()
        self._wake = threading.Event()  # set on a switch: the probe thread looks again
        self._stop = threading.Event()
        self._thread = None
        if probe_interval_s is not None and any(self._remote):
            self._thread = threading.Thread(
                target=self._probe_loop, name="edgesplit-band-probe", daemon=True
            )
            self._thread.start()

    # ---- the link

    def _links(self):
        return self._link_list

    def uplink_mbps(self) -> float | None:
        """The measured uplink rate (the most recently fed estimator's), or None."""
        if not self._link_list:
            return None
        newest = max(self._link_list, key=lambda lk: lk.last_transfer)
        return newest.uplink_mbps(self.bands.down_ratio)

    def rtt_ms(self) -> float | None:
        rtts = [lk.estimate().rtt_ms for lk in self._links()]
        return min((r for r in rtts if r is not None), default=None)

    def _server_down(self) -> bool:
        return any(not ex.available for exs in self._remote for ex in exs)

    def probe(self) -> bool:
        """Measure the link with one remote part of the next faster plan (or the current one's);
        True when a server answered."""
        target = self.selector.next_faster(self.current)
        candidates = [*self._remote[target]] if target is not None else []
        candidates += self._remote[self.current]
        if not candidates:
            candidates = [ex for exs in self._remote for ex in exs]
        if not candidates:
            return False
        ex = min(candidates, key=lambda e: sum(int(np.prod(t.shape)) for t in e.part.inputs))
        self._probes += 1
        return ex.probe()

    def pause_probes(self, paused: bool = True) -> None:
        """Stop (or restart) the idle-link probes, e.g. while the app is in the background and
        should leave the link to others. On restart the interval runs from now, as if a probe had
        just been sent."""
        if paused:
            self._paused.set()
        else:
            self.clock.last_probe = time.monotonic()
            self._paused.clear()
            self._wake.set()

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            if self._paused.is_set() or self._remote[self.current]:
                # Nothing to probe while the plan in use sends (its transfers measure the link):
                # sleep until a switch, without periodic wake-ups (on a CPU-starved device a waking
                # thread competes with the requests for the CPU quota and the GIL).
                self._wake.wait(5.0)
                continue
            if self._stop.wait(min(self.clock.interval_s, 0.05)):
                return
            last = max((lk.last_transfer for lk in self._links()), default=float("-inf"))
            # The probe holds no lock: a request never waits for one (at 0.13 Mbit/s one takes
            # seconds).
            busy = self._busy.locked()
            if not self.clock.due(time.monotonic(), last, busy, bool(self._remote[self.current])):
                continue
            before_mbps = self.uplink_mbps()
            self.clock.last_probe = time.monotonic()
            if not self.probe():
                continue
            self.clock.observed(before_mbps, self.uplink_mbps())
            self._choose()  # a switch resets the clock

    # ---- choosing and running

    def _choose(self) -> int:
        with self._choice_lock:
            return self._choose_locked()

    def _choose_locked(self) -> int:
        t0 = time.perf_counter()
        bw = self.uplink_mbps()
        if self._server_down():
            new, reason = self.selector.lowest(), "server unavailable"
        else:
            new, reason = self.selector.choose(self.current, bw), "uplink"
        self._decision_us.append((time.perf_counter() - t0) * 1e6)
        if new != self.current:
            self._switches.append(Switch(self._requests, self.current, new, bw, reason))
            self.current = new
            self.clock.reset()
            self._wake.set()
        return new

    def run(
        self, inputs: Mapping[str, np.ndarray], *, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        """Run one request on the plan chosen for the link as measured now."""
        with self._busy:
            k = self._choose()
            self._requests += 1  # a choice made while this request runs is for the next one
            t0 = time.perf_counter()
            out = self.sessions[k].run(inputs, timeout_s=timeout_s)
            self._plan_ms[k] += (time.perf_counter() - t0) * 1e3
            self._plan_requests[k] += 1
            self.last_plan = k
            return out

    def run_stream(
        self, inputs: Iterable[Mapping[str, np.ndarray]]
    ) -> Iterator[dict[str, np.ndarray]]:
        """Requests one after the other (a plan is chosen before each)."""
        for item in inputs:
            yield self.run(item)

    def stats(self) -> BandStats:
        d = list(self._decision_us) or [0.0]
        return BandStats(
            self.current,
            tuple(self._switches),
            tuple(round(x, 3) for x in self._plan_ms),
            tuple(self._plan_requests),
            float(np.median(d)),
            float(np.percentile(d, 99)),
            float(max(d)),
            self.uplink_mbps(),
            self.rtt_ms(),
            self._probes,
        )

    @property
    def input_specs(self):
        return self.manifest.inputs

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        for s in self.sessions:
            s.close()

    def __enter__(self) -> BandSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_bands(bundle: str | os.PathLike, **options) -> BandSession:
    """Open an adaptive bundle for plan switching (see :class:`BandSession`)."""
    return BandSession(bundle, **options)
