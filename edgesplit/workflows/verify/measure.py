"""Measure bundles against each other on this device, alternating between them to cancel drift.

Every bundle is loaded once into a real :class:`~edgesplit.runtime.session.Session`, called from
a thread of its own, and warmed up. Then, in rounds, each bundle is measured. For ``latency`` a
round is ``k`` single requests of each bundle, one of each bundle in turn, each after a pause of
``TURN_PAUSE_S`` (the runtime threads of whatever ran before go quiet: an idle ONNX Runtime or TVM
pool spins for a while after a call), and a bundle's figure is the median of its ``k``: the latency
of a request that comes alone, as an app's do, and as ``benchmarks/honest_baselines.py`` measures
the shipped bundle against plain ONNX Runtime. Requests back to back told another story: there
plain ORT's two threads over a big and a throttled little core measured 1-4% faster than the big
core alone (alexnet, PP-OCRv4 det on ``host-biglittle``), and shipped, while each request alone
took 4-7% longer than on the big core. For ``throughput`` a bundle's turn is the pause, then a
pipelined stream of ``k`` timed requests after the stream has filled, and its figure is the period
(ms per request). The order rotates from round to round (ABC, BCA, CAB ...), so no bundle always
follows the same other one.

The budget covers the warm-up and the rounds (loading the bundles comes before, like compiling
them: a bundle of hundreds of parts takes a while to load, and a budget spent on loading would keep
exactly the plans most worth checking unverified). The rounds and ``k`` are chosen from the warm-up
times to fit it, and no round starts that would not end within it.

With ``race`` (a race, as in successive halving), a bundle that is out of the running stops being
measured: after ``min_rounds`` rounds, one slower than the fastest by more than ``RACE_MARGIN`` in
every round so far, paired by round, takes no more turns. The time it would have taken goes to
more rounds of the bundles still in the running (up to ``max_rounds``), so that two close
candidates (plain ONNX Runtime and its replicas, often within 5%) are told apart on more rounds.
Only the bundles named in ``race`` can set the pace (those that meet the accuracy budget).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgesplit.runtime.harness import random_feeds, stream_period_ms, stream_requests
from edgesplit.runtime.session import Session, load

MIN_ROUNDS = 3
MAX_ROUNDS = 9
# A raced bundle slower than the fastest by more than this in every round so far stops.
RACE_MARGIN = 0.10
# Before each single request (latency) and each stream (throughput). Measured here (squeezenet on
# host-2core, sessions of two ORT threads each): a request straight after another session's, or
# 20 ms after it, took 1.3-1.7x as long; after 0.1 s, two identical sessions measured within 1%.
# One untimed request was not enough.
TURN_PAUSE_S = 0.1
# Timed requests per turn: latency (single requests), throughput (a stream, after it has filled).
TURN_REQUESTS = {"latency": (1, 5, 10), "throughput": (4, 10, 20)}


@dataclass(frozen=True)
class Measurement:
    """Per bundle, the figure of each completed round (ms), and the bundles that failed.

    Attributes:
        rounds_ms: name -> one figure per completed round; round ``r`` of each bundle is from the
            same round (a raced bundle that stopped early has fewer).
        errors: name -> why it could not be loaded or run.
        requests_per_turn: Timed requests per turn (0 when no round ran).
        elapsed_s: Measuring time (warm-up and rounds: what the budget bounds).
        load_s: Loading the bundles into Sessions, before (not in the budget, like compiling).
        short: Why no round ran (None when at least one did; fewer than the minimum count as
            weaker evidence, see :func:`edgesplit.workflows.verify.decide.decide`).
        stopped: Raced bundles that stopped early, by name, with the rounds they took.
    """

    rounds_ms: Mapping[str, list[float]]
    errors: Mapping[str, str]
    requests_per_turn: int
    elapsed_s: float
    short: str | None = None
    load_s: float = 0.0
    stopped: Mapping[str, int] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """Rounds run (the bundles still in the running took a turn in each)."""
        return max((len(v) for v in self.rounds_ms.values()), default=0)


@dataclass
class _Bench:
    """One loaded bundle, the thread that calls it and its turn.

    Each bundle is called from a thread of its own, as an app's thread would call it and as
    ``benchmarks/honest_baselines.py`` calls each candidate, not from the verifying thread: from
    that one thread, a candidate on the big core left the thread there between its turns (the
    Session keeps its caller pinned), and every other candidate started from there. Whether that
    is what made ``host-biglittle``'s verification measure plain ORT over big and little cores
    level with the big core alone (resnet50: 98 ms there, 111 ms in the benchmark's 480 requests,
    106 ms for the big core) is not settled: after the change resnet50 and PP-OCRv4 det shipped
    the big core, alexnet did not, and 20 s of rounds here vary by 10-20% from run to run."""

    name: str
    session: Session
    metric: str
    warm_ms: float = 0.0
    rounds_ms: list[float] = field(default_factory=list)
    stopped: bool = False
    caller: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="verify")
    )

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the bundle's own calling thread."""
        return self.caller.submit(fn).result()

    def close(self) -> None:
        self.session.close()
        self.caller.shutdown(wait=True)

    def turn(self, feeds: dict[str, Any], k: int) -> float:
        """One turn, after its pause: the median of ``k`` single requests (each but the first after
        a pause of its own), or a stream's period (ms per request), on the bundle's thread."""
        return self.call(lambda: self._turn(feeds, k))

    def _turn(self, feeds: dict[str, Any], k: int) -> float:
        if self.metric == "throughput":
            return self._stream(feeds, k)
        times = []
        for i in range(k):
            if i:
                time.sleep(TURN_PAUSE_S)
            t0 = time.perf_counter()
            self.session.run(feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))

    def _stream(self, feeds: dict[str, Any], k: int) -> float:
        return stream_period_ms(self.session, feeds, k)

    def turn_cost_ms(self, k: int) -> float:
        """What one turn should take, from the warm-up (its pause included)."""
        if self.metric == "throughput":
            return TURN_PAUSE_S * 1e3 + self.warm_ms * stream_requests(self.session, k)
        return (TURN_PAUSE_S * 1e3 + self.warm_ms) * k


def _load(
    bundles: Mapping[str, Path], metric: str, options: Callable[[str], Mapping | None]
) -> tuple[list[_Bench], dict[str, str]]:
    benches, errors = [], {}
    for name, path in bundles.items():
        try:
            sess = load(path, executor_options=options(name))
        except Exception as e:  # noqa: BLE001 - any failure disqualifies the candidate, with its reason
            errors[name] = f"cannot be loaded: {e}"
            continue
        benches.append(_Bench(name, sess, metric))
    return benches, errors


def _warm(
    benches: list[_Bench], feeds: dict[str, Any], errors: dict[str, str], *, again: bool = False
) -> list[_Bench]:
    """One untimed request each (first-run costs), then one timed as the estimate of its cost (for
    throughput, a short stream's period). ``again``: the timed one only, and the estimate is the
    faster of the two."""
    ok = []
    for b in benches:
        try:
            if not again:
                b.call(lambda b=b: b.session.run(feeds))
            warm_ms = b.turn(feeds, 4 if b.metric == "throughput" else 1)
            b.warm_ms = min(b.warm_ms, warm_ms) if again else warm_ms
        except Exception as e:  # noqa: BLE001
            errors[b.name] = f"cannot run: {e}"
            b.close()
            continue
        ok.append(b)
    return ok


def _choose(benches: list[_Bench], left_s: float, metric: str, min_rounds: int, max_rounds: int):
    """(rounds, requests per turn) that fit ``left_s``: as many rounds as fit up to ``max_rounds``
    at the preferred turn, else fewer requests per turn, else fewer than ``min_rounds`` rounds of
    the fewest requests; (0, 0) when not even one round fits."""
    lo, preferred, hi = TURN_REQUESTS[metric]

    def per_round_s(k: int) -> float:
        return sum(b.turn_cost_ms(k) for b in benches) / 1e3

    rounds = min(max_rounds, int(left_s / max(per_round_s(preferred), 1e-9)))
    if rounds >= min_rounds:
        k = preferred
        while k < hi and per_round_s(k + 1) * rounds <= left_s:
            k += 1
        return rounds, k
    for k in range(preferred - 1, lo - 1, -1):
        if per_round_s(k) * min_rounds <= left_s:
            return min_rounds, k
    rounds = min(min_rounds - 1, int(left_s / max(per_round_s(lo), 1e-9)))
    return (rounds, lo) if rounds >= 1 else (0, 0)


def measure(
    bundles: Mapping[str, Path],
    metric: str,
    budget_s: float,
    *,
    executor_options: Callable[[str], Mapping | None] = lambda name: None,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    progress: Callable[[str, int, int], None] | None = None,
    race: Collection[str] | None = None,
) -> Measurement:
    """Measure ``bundles`` (name -> bundle folder) in alternating rounds within ``budget_s``.

    Args:
        bundles: Loaded in this order, before the budget's clock starts.
        metric: ``latency`` (single-request medians) or ``throughput`` (stream periods).
        executor_options: Per bundle name, ``executor_options`` for :func:`edgesplit.load`.
        race: Race the bundles (see the module doc), paced by these names; None: every bundle
            takes every round.
    """
    t_load = time.perf_counter()
    benches, errors = _load(bundles, metric, executor_options)
    t0 = time.perf_counter()
    load_s = t0 - t_load

    def result(rounds_ms, k, short):
        return Measurement(rounds_ms, errors, k, time.perf_counter() - t0, short, load_s)

    try:
        if not benches:
            return result({}, 0, "nothing could be loaded")
        feeds = random_feeds(benches[0].session)
        benches = _warm(benches, feeds, errors)
        rounds, k = _choose(
            benches, budget_s - (time.perf_counter() - t0), metric, min_rounds, max_rounds
        )
        if not rounds and time.perf_counter() - t0 < budget_s:
            # one slow warm-up (a busy moment of the machine) says too little: look again
            benches = _warm(benches, feeds, errors, again=True)
            left_s = budget_s - (time.perf_counter() - t0)
            rounds, k = _choose(benches, left_s, metric, min_rounds, max_rounds)
        if not rounds:
            need = sum(b.turn_cost_ms(TURN_REQUESTS[metric][0]) for b in benches) / 1e3
            short = (
                f"not enough time to verify: warming up and one round need about "
                f"{need + time.perf_counter() - t0:.1f} s, the budget is {budget_s:g} s"
            )
            return result({}, 0, short)
        plan = _Rounds(rounds, k, t0 + budget_s, max_rounds, min_rounds, race)
        plan.run(benches, feeds, errors, progress)
        done = {b.name: b.rounds_ms for b in benches if b.name not in errors}
        n = min((len(v) for v in done.values()), default=0)
        short = None if n else "not enough time to verify: no round ended within the budget"
        stopped = {b.name: len(b.rounds_ms) for b in benches if b.stopped and b.name in done}
        return replace(result(done, k, short), stopped=stopped)
    finally:
        for b in benches:
            b.close()


@dataclass
class _Rounds:
    """The rounds: ``planned`` of ``k`` requests a turn, none ending after ``deadline``; raced
    (``race``: the names that may set the pace), more of them, up to ``max_rounds``, when
    bundles stop."""

    planned: int
    k: int
    deadline: float
    max_rounds: int
    min_rounds: int
    race: Collection[str] | None

    def run(
        self,
        benches: list[_Bench],
        feeds: dict[str, Any],
        errors: dict[str, str],
        progress: Callable[[str, int, int], None] | None,
    ) -> None:
        """Rounds in rotating order; every bundle's figures land in its ``rounds_ms``."""
        r = 0
        while r < self.planned:
            live = [b for b in benches if b.name not in errors and not b.stopped]
            round_s = sum(b.turn_cost_ms(self.k) for b in live) / 1e3
            if time.perf_counter() + round_s > self.deadline:
                break
            shift = r % max(1, len(live))
            order = live[shift:] + live[:shift]
            if order and order[0].metric == "latency":
                self._interleaved(order, feeds, errors, r)
            else:
                for b in order:
                    time.sleep(TURN_PAUSE_S)
                    try:
                        b.rounds_ms.append(b.turn(feeds, self.k))
                    except Exception as e:  # noqa: BLE001
                        errors[b.name] = f"failed in round {r + 1}: {e}"
            r += 1
            if self.race is not None and r >= self.min_rounds and self._stop(live, errors):
                self._more(r, [b for b in live if not b.stopped and b.name not in errors])
            if progress:
                progress("verify: measure", r, self.planned)

    def _interleaved(
        self, order: list[_Bench], feeds: dict[str, Any], errors: dict[str, str], r: int
    ) -> None:
        """A latency round: ``k`` single requests of each bundle, one of each in ``order`` at a
        time, each after the pause; each bundle's figure is the median of its ``k``. Turns of
        ``k`` requests one bundle after another let a phase of the machine that lasted a second
        fall on one bundle's turn: mobilenetv1 on ``host-biglittle``, turns of 10 requests,
        measured per-round ratios of 0.75-1.28 between the big core alone and plain ORT, where
        the benchmark's one request of each in turn put the big core 4-6% ahead (+-2%)."""
        times: dict[str, list[float]] = {b.name: [] for b in order}

        def one(b: _Bench) -> float:
            t0 = time.perf_counter()
            b.session.run(feeds)
            return (time.perf_counter() - t0) * 1e3

        for _ in range(self.k):
            for b in order:
                if b.name in errors:
                    continue
                time.sleep(TURN_PAUSE_S)
                try:
                    times[b.name].append(b.call(lambda b=b: one(b)))
                except Exception as e:  # noqa: BLE001
                    errors[b.name] = f"failed in round {r + 1}: {e}"
        for b in order:
            if b.name not in errors:
                b.rounds_ms.append(float(np.median(times[b.name])))

    def _stop(self, live: list[_Bench], errors: Mapping[str, str]) -> bool:
        """Stop the bundles out of the running; whether any stopped."""
        ok = [b for b in live if b.name not in errors]
        pace = [b for b in ok if self.race is not None and b.name in self.race]
        if not pace:
            return False
        lead = min(pace, key=lambda b: float(np.median(b.rounds_ms)))
        best = np.asarray(lead.rounds_ms)
        out = [
            b
            for b in ok
            if b is not lead and float((np.asarray(b.rounds_ms) / best).min()) > 1 + RACE_MARGIN
        ]
        for b in out:
            b.stopped = True
        return bool(out)

    def _more(self, done: int, live: list[_Bench]) -> None:
        """Plan as many rounds as now fit the time left, up to ``max_rounds``."""
        round_s = sum(b.turn_cost_ms(self.k) for b in live) / 1e3
        fit = int(max(self.deadline - time.perf_counter(), 0.0) / max(round_s, 1e-9))
        self.planned = max(self.planned, min(self.max_rounds, done + fit))
