"""Adaptive bundles: a plan per bandwidth band compiled together, and switched at run time."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import onnx
import pytest
from netlab import (
    NetLab,
    free_port,
    kill_process,
    make_bundle,
    require_netns,
    serve_command,
    single_tensor_cuts,
    stop_process,
    wait_ready,
)

from edgesplit.bundle.format import open_bundle
from edgesplit.compile.bands import part_key
from edgesplit.errors import BundleError
from edgesplit.model import zoo
from edgesplit.runtime.adaptive import LinkEstimator
from edgesplit.runtime.bands import BandSelector, ProbeClock, load_bands
from edgesplit.runtime.harness import random_feeds
from edgesplit.runtime.session import load
from edgesplit.workflows.deploy import deploy

# A slow board (predicted: nothing is measured) and a fast server, so that the best plan runs from
# device-only at low bandwidth through a cut to server-only at high bandwidth.
SLOW_BOARD = """\
name: slowboard
kind: device
description: a slow board, predicted
processors:
  cpu:
    kind: cpu
    peak_gflops: 2
    mem_bandwidth_gbps: 2
    active_w: 3.0
    idle_w: 0.3
    backends:
      - runtime: ort
"""


@pytest.fixture(scope="module")
def adaptive(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("adaptive")
    (d / "board.yaml").write_text(SLOW_BOARD)
    model = zoo.save("chain_shrink", d / "m.onnx")
    link = dict(server="server-a100", bandwidth_mbps=10, rtt_ms=10)
    manifest = deploy(model, d / "board.yaml", d / "bundle", **link)
    with load(d / "bundle") as sess:  # the default plan, remote parts on their local fallback
        feeds = random_feeds(sess)
        want = sess.run(feeds)
    return {
        "dir": d,
        "model": model,
        "bundle": d / "bundle",
        "manifest": manifest,
        "feeds": feeds,
        "want": want,
    }


def same(out: dict, want: dict) -> bool:
    return all(np.allclose(out[k], want[k], rtol=1e-4, atol=1e-5) for k in want)


def test_the_bundle_holds_a_band_table_and_each_part_once(adaptive):
    m = open_bundle(adaptive["bundle"])
    bands = m.bands
    assert bands is not None and len(bands.plans) >= 3
    assert bands.bands[0]["lo_mbps"] == 0.1 and bands.bands[-1]["hi_mbps"] == 1000.0
    assert all(
        a["hi_mbps"] == b["lo_mbps"] and a["plan"] != b["plan"]
        for a, b in zip(bands.bands, bands.bands[1:])
    )
    low, high = bands.plans[bands.plan_at(0.1)].plan, bands.plans[bands.plan_at(1000)].plan
    assert not any(p.remote for p in low.parts) and all(p.remote for p in high.parts)
    # the union of the parts, each stored once; a band plan equal to the default reuses its parts
    keys = {
        part_key(p, p.nodes)
        for plan in (m.plan, *(bp.plan for bp in bands.plans))
        for p in plan.parts
    }
    assert len({p.name for p in m.parts}) == len(m.parts) == len(keys)
    assert set(m.files) == {f for p in m.parts for f in (p.file, p.onnx_file)}
    default = [part_key(p, p.nodes) for p in m.plan.parts]
    for bp in bands.plans:
        if [part_key(p, p.nodes) for p in bp.plan.parts] == default:
            assert bp.parts == bands.default_parts
    assert [p.name for p in m.plan_parts()] == list(bands.default_parts)


def test_every_band_plan_computes_the_model(adaptive):
    for k in range(len(adaptive["manifest"].bands.plans)):
        with load(adaptive["bundle"], band_plan=k) as sess:
            assert same(sess.run(adaptive["feeds"]), adaptive["want"])
            assert len(sess.manifest.parts) == len(sess.manifest.plan.parts)


def test_a_band_plan_naming_a_missing_part_is_refused(adaptive, tmp_path):
    import shutil

    bad = tmp_path / "bundle"
    shutil.copytree(adaptive["bundle"], bad)
    data = json.loads((bad / "manifest.json").read_text())
    data["bands"]["plans"][0]["parts"] = ["nope"]
    (bad / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="band plan 0 names parts the bundle lacks: nope"):
        open_bundle(bad)


def test_no_bands_flag_and_explain(adaptive, tmp_path, capsys):
    from edgesplit.cli.main import main

    d = adaptive["dir"]
    plan = tmp_path / "plan.json"
    args = [
        "partition",
        str(adaptive["model"]),
        "-d",
        str(d / "board.yaml"),
        "--server",
        "server-a100",
    ]
    for argv in (
        [*args, "--bandwidth-mbps", "10", "--rtt-ms", "10", "-o", str(plan), "-q"],
        [
            "compile",
            str(adaptive["model"]),
            "--plan",
            str(plan),
            "-o",
            str(tmp_path / "b"),
            "--no-bands",
        ],
        ["explain", str(plan), "--bands", "--per-decade", "1"],
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    assert open_bundle(tmp_path / "b").bands is None
    out = capsys.readouterr().out
    assert "envelope" in out and "breakpoints:" in out
    breaks = adaptive["manifest"].bands.breakpoints_mbps
    assert all(f"{b:.6g}" in out for b in breaks)  # explain finds the compiled table's breakpoints


def test_selector_has_hysteresis(adaptive):
    bands = adaptive["manifest"].bands
    sel = BandSelector(bands, hysteresis=0.15)
    x = bands.breakpoints_mbps[-1]
    left, right = bands.plan_at(x * 0.9), bands.plan_at(x * 1.1)
    assert sel.choose(left, x * 1.1) == left  # within 15 % of the breakpoint: stay
    assert sel.choose(left, x * 1.2) == right
    assert sel.choose(right, x / 1.1) == right
    assert sel.choose(right, x / 1.2) == left
    assert sel.choose(left, None) == left
    assert sel.choose(left, 1000.0) == bands.plan_at(1000.0)
    assert sel.next_faster(bands.plan_at(0.1)) == bands.bands[1]["plan"]
    assert sel.next_faster(bands.plan_at(1000.0)) is None


def test_run_adaptive_without_a_server_reports_the_band_plans(adaptive, capsys):
    from edgesplit.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["run", str(adaptive["bundle"]), "--adaptive", "--repeat", "2", "--warmup", "1"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "band plans (switched between requests)" in out
    lowest = adaptive["manifest"].bands.bands[0]["plan"]
    assert f"{lowest} (now)" in out and "0 switches" in out  # no server: the plan that sends least


def test_uplink_estimate_weighs_the_downlink():
    link = LinkEstimator()
    link.add_ping(10.0)
    # 100 kB up and 100 kB down in 10 ms RTT + wire; up at 8 Mbit/s and down at 16: 100 + 50 ms
    for _ in range(4):
        link.add_transfer(200_000, 160.0, 0.0, up_nbytes=100_000)
    assert link.uplink_mbps(down_ratio=2.0) == pytest.approx(8.0)
    assert link.uplink_mbps(down_ratio=1.0) == pytest.approx(200_000 * 8 / 150e3)
    link.add_transfer(
        200_000, 1210.0, 0.0, up_nbytes=100_000
    )  # the link drops 8x: the newest counts
    assert link.uplink_mbps(down_ratio=2.0) == pytest.approx(1.0)
    for _ in range(10):  # small transfers are summed until they hold 64 kB
        link.add_transfer(10_000, 20.0, 0.0, up_nbytes=10_000)
    assert link.uplink_mbps(down_ratio=2.0) == pytest.approx(8.0)


def test_probe_clock_backs_off_while_measures_agree_and_resets_when_they_do_not():
    clock = ProbeClock(0.2, 2.0, margin=1.15)
    for want in (0.4, 0.8, 1.6, 2.0, 2.0):  # the same rate again and again: back off, capped
        assert not clock.observed(10.0, 11.0)
        assert clock.interval_s == pytest.approx(want)
    # a probe that began at CAT1 and ended after the link rose measures a mixture: look again now
    assert clock.observed(0.13, 0.5) and clock.interval_s == pytest.approx(0.2)
    assert clock.observed(None, 5.0)  # a first estimate counts as news
    assert not clock.disagree(5.0, None)


def test_probe_clock_probes_in_request_gaps_and_never_while_the_plan_sends():
    clock = ProbeClock(0.2, 2.0, margin=1.15)
    clock.interval_s = 1.0
    assert not clock.due(now=10.5, last_transfer=10.0, busy=False, plan_sends=False)  # quiet 0.5 s
    assert clock.due(now=11.0, last_transfer=10.0, busy=False, plan_sends=False)  # a gap: probe
    assert not clock.due(
        now=11.5, last_transfer=10.0, busy=True, plan_sends=False
    )  # a request runs
    assert clock.due(
        now=12.0, last_transfer=10.0, busy=True, plan_sends=False
    )  # no gap for 2 intervals
    assert not clock.due(
        now=99.0, last_transfer=10.0, busy=False, plan_sends=True
    )  # transfers measure
    clock.last_probe = 98.5
    assert not clock.due(
        now=99.0, last_transfer=10.0, busy=False, plan_sends=False
    )  # a probe is news


def test_a_step_up_in_the_measured_rate_switches_within_one_observation(adaptive):
    """The rate rises from CAT1 to 200 Mbit/s: the next estimate (one probe-sized transfer) picks
    the table's plan for the new rate; a drop back is seen from the next transfer too."""
    bands = adaptive["manifest"].bands
    sel, link = BandSelector(bands, hysteresis=0.15), LinkEstimator()
    link.add_ping(10.0)
    nbytes = 100_000

    def send(mbps: float) -> int:
        link.add_transfer(nbytes, 10.0 + nbytes * 8 / (mbps * 1e3), 0.0, up_nbytes=nbytes)
        return sel.choose(current, link.uplink_mbps())

    current = sel.lowest()
    for _ in range(5):
        current = send(0.13)
    assert current == bands.plan_at(0.13)
    current = send(200.0)
    assert current == bands.plan_at(200.0) != bands.plan_at(0.13)
    current = send(0.13)
    assert current == bands.plan_at(0.13)


def check_one_plan_per_request(bs) -> None:
    """Each plan's session ran every one of its parts once per request it got: no mixing."""
    for k, sess in enumerate(bs.sessions):
        assert all(p.runs == bs.stats().plan_requests[k] for p in sess.stats().parts)


@pytest.mark.slow
def test_switches_to_the_server_then_falls_back_when_it_dies(adaptive):
    port = free_port()
    proc = subprocess.Popen(
        serve_command(adaptive["bundle"], "127.0.0.1", port), stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        opts = {"remote": {"url": url, "timeout_s": 2.0}}
        with load_bands(adaptive["bundle"], executor_options=opts, probe_interval_s=0.05) as bs:
            lowest = bs.selector.lowest()
            assert bs.current == lowest  # nothing measured yet: the plan that sends least
            for _ in range(6):  # loopback is faster than any band: the server-only plan
                assert same(bs.run(adaptive["feeds"]), adaptive["want"])
                time.sleep(0.1)  # a gap between requests: the idle link gets probed
            top = bs.bands.plan_at(1000.0)
            assert bs.current == top and bs.stats().switches[0].to_plan == top
            kill_process(proc)  # killed in the middle of the stream
            for _ in range(4):
                assert same(bs.run(adaptive["feeds"]), adaptive["want"])
            st = bs.stats()
            assert st.current == lowest and st.switches[-1].reason == "server unavailable"
            assert st.plan_requests[top] >= 1 and sum(st.plan_requests) == 10
            check_one_plan_per_request(bs)
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_no_probes_while_the_plan_in_use_sends(adaptive):
    """On the server-only plan every request's transfers measure the link: the idle-link probe
    (which would queue a whole model's work on the server before the next request) stays quiet,
    however long the gaps between requests."""
    port = free_port()
    proc = subprocess.Popen(
        serve_command(adaptive["bundle"], "127.0.0.1", port), stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        opts = {"remote": {"url": url, "timeout_s": 5.0}}
        with load_bands(adaptive["bundle"], executor_options=opts, probe_interval_s=0.02) as bs:
            top = bs.bands.plan_at(1000.0)
            for _ in range(100):  # the device-only plan sends nothing: a probe finds the fast link
                bs.run(adaptive["feeds"])
                if bs.current == top:
                    break
                time.sleep(0.05)
            assert bs.current == top
            bs.run(adaptive["feeds"])
            probes = bs.stats().probes
            for _ in range(4):
                time.sleep(0.2)  # ten probe intervals of quiet between requests
                assert same(bs.run(adaptive["feeds"]), adaptive["want"])
            assert bs.stats().probes == probes and bs.current == top
            bs.pause_probes()
            assert bs._paused.is_set()
            bs.pause_probes(False)
    finally:
        stop_process(proc)


def test_a_bundle_without_bands_is_refused_by_band_sessions(tmp_path):
    model = zoo.save("chain_shrink", tmp_path / "m.onnx")
    cut = single_tensor_cuts(onnx.load(model))[0]
    bundle = make_bundle(model, tmp_path / "b", [cut], [False, True])
    with pytest.raises(BundleError, match="no band table"):
        load_bands(bundle)


@pytest.mark.netlab
@pytest.mark.slow
def test_band_plans_follow_a_shaped_link_and_a_dead_server(adaptive):
    """200 -> 5 -> 50 -> 2 Mbit/s during a stream: from the 4th request at each rate on, the plan
    is the band table's for that rate; outputs are right throughout; a killed server: local plan.
    (The first request at a low rate still sends the 602 kB input to the server: 2.4 s at 2 Mbit/s,
    10 s at the 0.5 Mbit/s this test used before.)"""
    require_netns()
    bundle = adaptive["bundle"]
    with NetLab(200, 10) as lab:
        server = lab.spawn(serve_command(bundle, lab.server_ip, 8000), stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{lab.relay(8000).port}"
        wait_ready(url)
        opts = {"remote": {"url": url, "timeout_s": 30.0}}
        with load_bands(
            bundle, executor_options=opts, probe_interval_s=0.2, max_probe_interval_s=1.0
        ) as bs:
            seen = {}
            for rate in (200, 5, 50, 2):
                lab.set_rate(rate)
                plans = []
                for _ in range(6):
                    assert same(bs.run(adaptive["feeds"]), adaptive["want"])
                    plans.append(bs.last_plan)
                    time.sleep(0.3)  # a stream of a few frames a second: the idle link gets probed
                seen[rate] = plans
            for rate, plans in seen.items():
                assert plans[3:] == [bs.bands.plan_at(rate)] * 3, (rate, seen, bs.stats())
            kill_process(server)  # killed in the middle of the stream
            lab.set_rate(200)
            for _ in range(3):
                assert same(bs.run(adaptive["feeds"]), adaptive["want"])
            assert bs.current == bs.selector.lowest()
            check_one_plan_per_request(bs)
