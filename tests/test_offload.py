"""The remote executor in a Session: equal outputs, fallback, clear errors, a server killed
mid-stream."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from netlab import (
    free_port,
    make_bundle,
    serve_command,
    single_tensor_cuts,
    stop_process,
    wait_ready,
)

from edgesplit.errors import RemoteError
from edgesplit.runtime.adaptive import LinkEstimator, OffloadPolicy
from edgesplit.runtime.session import load
from edgesplit.serve.server import ServeOptions, ServerThread


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> dict:
    """squeezenet cut in three; the middle and last parts are server parts (with and without
    fallback)."""
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("offload")
    path = zoo.save("squeezenet", d / "squeezenet.onnx")
    cuts = single_tensor_cuts(onnx.load(path))
    cuts = [cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]]
    whole = ort.InferenceSession(str(path))
    xs = [
        np.random.default_rng(i).standard_normal((1, 3, 224, 224)).astype(np.float32)
        for i in range(100)
    ]
    return {
        "fallback": make_bundle(path, d / "with_fallback", cuts, [False, True, True]),
        "nofallback": make_bundle(
            path, d / "without_fallback", cuts, [False, True, True], fallback=False
        ),
        "xs": xs,
        "ys": _Outputs(whole, xs),
    }


class _Outputs:
    """The whole model's output for each of ``xs``, computed when a test first reads it (the quick
    tests read a few; the stream tests all 100)."""

    def __init__(self, whole: ort.InferenceSession, xs: list[np.ndarray]):
        self.whole, self.xs, self.cache = whole, xs, {}

    def __len__(self) -> int:
        return len(self.xs)

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self.cache:
            self.cache[i] = self.whole.run(None, {"input": self.xs[i]})[
                0
            ]  # IndexError past the end
        return self.cache[i]


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5))


def test_session_over_the_server_equals_the_whole_model(model):
    with (
        ServerThread(model["fallback"], ServeOptions(port=0, token="t")) as srv,
        load(
            model["fallback"], executor_options={"remote": {"url": srv.url, "token": "t"}}
        ) as sess,
    ):
        for x, y in zip(model["xs"][:5], model["ys"]):
            assert close(sess.run({"input": x})["logits"], y)
        stats = sess.remote_stats()
        assert set(stats) == {"p1", "p2"}
        for s in stats.values():
            assert s.remote_runs == 5 and s.local_runs == 0 and s.failures == 0
            assert (
                s.sent_nbytes > 0 and s.rtt_ms is not None and s.bandwidth_mbps and s.goodput_mbps
            )
            # a remote call split: the server's compute within its own time, within the call
            assert 0 < s.compute_ms_median <= s.server_ms_median <= s.remote_ms_median, s
        assert {p.name: p.executed_by for p in sess.stats().parts} == {
            "p0": "ort",
            "p1": "remote",
            "p2": "remote",
        }


@pytest.mark.slow
def test_run_splits_each_remote_call_into_compute_server_and_wire(model):
    """``edgesplit run --server``: per remote part, a call's median, the server's compute in it,
    the server's other time and the rest, which add up to the call."""
    import os

    from conftest import run_cli

    with ServerThread(model["fallback"], ServeOptions(port=0)) as srv:
        env = {**os.environ, "COLUMNS": "250"}
        r = run_cli(
            "run",
            str(model["fallback"]),
            "--server",
            srv.url,
            "--repeat",
            "3",
            "--warmup",
            "1",
            env=env,
        )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if "remote parts (offload)" in ln) :]
    head = next(ln for ln in table if "compute ms" in ln)
    assert "call ms" in head and "server other ms" in head and "wire+client ms" in head
    for part in ("p1", "p2"):
        row = next(ln for ln in table if ln.startswith(f"│ {part} "))
        cells = [c.strip() for c in row.strip("│").split("│")]
        call, compute, other, rest = (float(cells[k]) for k in range(7, 11))
        assert compute > 0 and call == pytest.approx(compute + other + rest, abs=2e-3), cells


def test_no_server_url_runs_the_fallback_or_says_why(model):
    with load(model["fallback"]) as sess:
        assert close(sess.run({"input": model["xs"][0]})["logits"], model["ys"][0])
        assert sess.remote_stats()["p1"].mode == "local"
    with pytest.raises(RemoteError, match="no server URL was given.*no local fallback"):
        load(model["nofallback"])


def test_unreachable_server_falls_back_quickly(model):
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with load(model["fallback"], executor_options={"remote": {"url": url, "timeout_s": 2}}) as sess:
        for x, y in zip(model["xs"][:3], model["ys"]):
            assert close(sess.run({"input": x})["logits"], y)
        s = sess.remote_stats()["p1"]
        assert s.remote_runs == 0 and s.local_runs == 3 and "cannot connect" in s.last_error
    assert time.monotonic() - t0 < 6


def test_unreachable_server_without_fallback_fails_clearly_within_the_timeout(model):
    url = f"http://127.0.0.1:{free_port()}"
    with load(
        model["nofallback"], executor_options={"remote": {"url": url, "timeout_s": 1}}
    ) as sess:
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(RemoteError, match=r"part p1: .*(unavailable|cannot connect)"):
                sess.run({"input": model["xs"][0]}, timeout_s=10)
            assert (
                time.monotonic() - t0 < 5
            )  # a deadline, not a speed: the run's own timeout is 10 s


def test_fallback_can_be_refused(model):
    url = f"http://127.0.0.1:{free_port()}"
    with (
        load(
            model["fallback"], executor_options={"remote": {"url": url, "fallback": False}}
        ) as sess,
        pytest.raises(RemoteError),
    ):
        sess.run({"input": model["xs"][0]})


def test_wrong_token_is_an_error_not_a_fallback(model):
    with (
        ServerThread(model["fallback"], ServeOptions(port=0, token="right")) as srv,
        load(
            model["fallback"], executor_options={"remote": {"url": srv.url, "token": "wrong"}}
        ) as sess,
        pytest.raises(RemoteError, match="HTTP 401: missing or wrong bearer token"),
    ):
        sess.run({"input": model["xs"][0]})


def start_server(bundle) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(serve_command(bundle, "127.0.0.1", port), stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc, url


@pytest.mark.slow
def test_a_stopped_server_is_too_slow_and_the_part_falls_back(model):
    proc, url = start_server(model["fallback"])
    try:
        opts = {"remote": {"url": url, "timeout_s": 0.5}}
        with load(model["fallback"], executor_options=opts) as sess:
            assert close(sess.run({"input": model["xs"][0]})["logits"], model["ys"][0])
            os.kill(proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            assert close(sess.run({"input": model["xs"][1]})["logits"], model["ys"][1])
            # a deadline, not a speed: each of the two remote parts gives up after 0.5 s, where the
            # client's default timeout would wait 10 s
            assert time.monotonic() - t0 < 5
            assert "no answer within the deadline" in sess.remote_stats()["p1"].last_error
    finally:
        stop_process(proc)


@pytest.mark.slow
@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "no-fallback"])
def test_server_killed_in_the_middle_of_a_stream_of_100(model, fallback):
    bundle = model["fallback" if fallback else "nofallback"]
    proc, url = start_server(bundle)
    timeout_s = 1.0
    killer = threading.Timer(0, lambda: os.kill(proc.pid, signal.SIGKILL))
    done: list[float] = []
    try:
        with load(
            bundle, executor_options={"remote": {"url": url, "timeout_s": timeout_s}}
        ) as sess:
            results = []
            if fallback:  # pipelined: requests are in flight when the server dies
                for i, out in enumerate(sess.run_stream({"input": x} for x in model["xs"])):
                    results.append(out["logits"])
                    if i == 30:
                        killer.start()
            else:
                for i, x in enumerate(model["xs"]):
                    if i == 30:
                        killer.start()
                    t0 = time.monotonic()
                    try:
                        results.append(sess.run({"input": x}, timeout_s=30)["logits"])
                    except RemoteError as e:
                        assert "part p1" in str(e) or "part p2" in str(e)
                        results.append(e)
                    done.append(time.monotonic() - t0)
            stats = sess.remote_stats()
    finally:
        killer.cancel()
        stop_process(proc)
    assert len(results) == 100
    ok = [i for i, r in enumerate(results) if isinstance(r, np.ndarray)]
    assert all(close(results[i], model["ys"][i]) for i in ok), "a wrong output"
    if fallback:
        assert len(ok) == 100
        assert stats["p1"].remote_runs >= 30 and stats["p1"].local_runs >= 1
    else:
        assert 30 <= len(ok) < 100
        assert all(isinstance(r, RemoteError) for r in results[len(ok) :])
        assert max(done) < 2 * timeout_s + 0.5, max(done)  # two remote parts, one deadline each


def test_link_estimator_and_policy_are_measured_and_hysteretic():
    link = LinkEstimator()
    assert link.estimate().bandwidth_mbps is None
    link.add_ping(10.0)
    for _ in range(
        4
    ):  # 125 kB both ways in 10 ms RTT + 100 ms on the wire + 5 ms server: 10 Mbit/s
        link.add_transfer(125_000, 115.0, 5.0)
    est = link.estimate()
    assert est.rtt_ms == 10.0 and est.bandwidth_mbps == pytest.approx(10.0)
    assert est.transfer_ms(125_000) == pytest.approx(110.0)

    policy = OffloadPolicy(125_000, local_ms=90.0, probe_interval_s=1.0)
    assert (
        policy.choose(est, now=0.0) == "local"
    )  # 110 ms predicted by the link model > 90 ms * 1.1
    policy = OffloadPolicy(125_000, local_ms=150.0, probe_interval_s=1.0)
    assert policy.choose(est, now=0.0) == "remote"
    policy.observed_remote(400.0, 5.0, now=0.0)  # the link got slow
    policy.observed_remote(400.0, 5.0, now=0.1)
    assert policy.choose(est, now=0.2) == "local"
    assert policy.choose(est, now=0.5) == "local"
    assert policy.choose(est, now=1.3) == "remote"  # a probe after 1 s
    policy.observed_remote(400.0, 5.0, now=1.3)
    assert policy.choose(est, now=2.0) == "local"  # confirmed: the next probe waits 2 s
    assert policy.choose(est, now=3.4) == "remote"
    policy.observed_remote(50.0, 5.0, now=3.4)  # the link is back
    assert policy.choose(est, now=3.5) == "remote" and policy.switches == 2


def test_a_probe_that_finds_the_link_moving_looks_again_soon():
    """Local, probing a slow link: probes that confirm it double the interval; one whose round trip
    moved by more than the margin, though still too slow to switch, sets it back to the base."""
    est = LinkEstimator().estimate()
    policy = OffloadPolicy(125_000, local_ms=100.0, probe_interval_s=1.0)
    policy.observed_remote(1000.0, 5.0, now=0.0)
    assert policy.choose(est, now=0.1) == "local"
    assert policy.choose(est, now=1.2) == "remote"  # probe 1 after 1 s
    policy.observed_remote(1000.0, 5.0, now=1.2)  # confirmed: next in 2 s
    assert policy.choose(est, now=2.5) == "local" and policy.choose(est, now=3.3) == "remote"
    policy.observed_remote(1000.0, 5.0, now=3.3)  # confirmed again: next in 4 s
    assert policy.choose(est, now=6.0) == "local" and policy.choose(est, now=7.4) == "remote"
    policy.observed_remote(300.0, 5.0, now=7.4)  # 3.3x faster, still > 110 ms: stay, but look soon
    assert policy.choose(est, now=8.0) == "local"
    assert policy.choose(est, now=8.5) == "remote"  # 1.1 s later, not 8 s
    policy.observed_remote(105.0, 5.0, now=8.5)  # within the hysteresis of local: stays local
    assert policy.choose(est, now=9.0) == "local" and policy.switches == 1  # the first, at 0.1 s
