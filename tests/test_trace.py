"""The runtime trace: timing records, the breakdown, detailed (kernel) traces, and ``run --trace``.

The Chrome trace is checked against the Trace Event Format's documented JSON object form here,
not by Perfetto's trace processor: PyPI's ``perfetto`` package downloads its trace_processor_shell
binary on first use, which cannot work offline.
"""

from __future__ import annotations

import json
import platform
from collections import defaultdict

import pytest
from conftest import run_cli

from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile.run import ProfileOptions
from edgesplit.runtime.chrome import chrome_trace, trace_event_problems
from edgesplit.runtime.harness import benchmark, random_feeds
from edgesplit.runtime.session import load
from edgesplit.runtime.trace import build_trace
from edgesplit.workflows.compile import compile_bundle
from edgesplit.workflows.resolve import partition

# tiny_dag's two branches on core1 as two parts that become ready together (one must queue),
# the stem and the merge on core0: 4 parts on host-2core's two processors.
PINS = {
    "stem.conv": "core0",
    "stem.relu": "core0",
    "left.conv": "core1",
    "left.relu": "core1",
    "right.conv": "core1",
    "merge.add": "core0",
}
REPEAT = 6


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    graph = load_model(zoo.save("tiny_dag", d / "tiny_dag.onnx"))
    plan = partition(
        graph, "host-2core", pins=PINS, profiling=ProfileOptions(runs=3)
    )  # pinned: any figures do
    compile_bundle(graph, plan, d / "bundle")
    return d / "bundle"


@pytest.fixture(scope="module")
def report(bundle):
    with load(bundle) as sess:
        yield benchmark(sess, random_feeds(sess), repeat=REPEAT, warmup=2), sess.manifest


def test_one_record_per_part_run_on_its_processor_in_time_order(report):
    rep, manifest = report
    trace = rep.trace
    assert len(trace.requests) == REPEAT
    assert len(trace.parts) == REPEAT * len(manifest.parts) == REPEAT * 4
    procs = {p.name: p.processor for p in manifest.parts}
    assert set(trace.lanes) == {"core0", "core1"}
    for r in trace.parts:
        assert r.lane == r.processor == procs[r.part]
        times = [
            r.ready_ns,
            r.submit_ns,
            r.start_ns,
            r.run_start_ns,
            r.run_end_ns,
            r.collected_ns,
            r.done_ns,
        ]
        assert times == sorted(times)
        req = trace.request(r.request)
        assert req.start_ns <= r.ready_ns and r.done_ns <= req.end_ns
        assert r.run_cpu_ns is None  # only in detailed traces
    # a part's successors become ready exactly when its outputs are merged
    deps = {p.name: p.depends_on for p in manifest.parts}
    by = {(r.request, r.part): r for r in trace.parts}
    for r in trace.parts:
        if deps[r.part]:
            assert r.ready_ns == max(by[(r.request, d)].done_ns for d in deps[r.part])
        else:
            assert r.ready_ns == trace.request(r.request).start_ns


def test_two_parts_ready_at_once_on_one_processor_queue(report):
    rep, _ = report
    waits = [r for r in rep.trace.parts if r.part in ("p1", "p2")]
    assert any(not r.worker_idle for r in waits)  # the second of the two found core1 busy
    for r in rep.trace.parts:
        assert (r.handoff_ns is None) == (not r.worker_idle)


def test_worker_idle_is_derived_from_the_lane_timeline():
    from edgesplit.bundle.format import PartArtifact

    parts = [
        PartArtifact(n, "cpu", "ort", f"{n}.onnx", f"{n}.onnx", (), ()) for n in ("a", "b", "c")
    ]
    # (request, part, run_index, ready, submit, start, run_start, run_end, collected, done, cpu)
    raw = [
        (0, "a", 0, 0, 1, 2, 3, 10, 11, 12, None),
        (0, "b", 0, 12, 13, 14, 15, 20, 21, 22, None),  # submitted after a was done: idle
        (0, "c", 0, 12, 14, 22, 23, 30, 31, 32, None),  # submitted while b was queued: busy
    ]
    trace = build_trace(raw, [(0, 0, 33)], parts, lambda p: p.processor)
    idle = {r.part: r.worker_idle for r in trace.parts}
    assert idle == {"a": True, "b": True, "c": False}
    assert trace.parts[2].queue_wait_ns == 10 and trace.parts[2].handoff_ns is None
    (busy,) = trace.busy()
    assert busy.busy_ns == 7 + 5 + 7 and busy.window_ns == 32 and busy.runs == 3


def test_breakdown_is_consistent(report):
    rep, manifest = report
    b = rep.breakdown
    assert [p.part for p in b.parts] == [p.name for p in manifest.parts]
    for p in b.parts:
        assert p.runs == REPEAT
        assert 0 < p.run_ms <= p.span_ms
        assert p.queue_wait_ms >= 0
        assert p.handoff_ms is None or p.handoff_ms >= 0
        assert p.predicted_ms is not None and p.predicted_ms > 0
        assert p.engine_ms is None and p.run_cpu_ms is None  # not a detailed trace
    last = manifest.parts[-1].name
    for r in b.requests:
        assert r.path[-1] == last and r.path[0] == "p0"
        parts = r.run_ms + r.io_ms + r.handoff_ms + r.queue_ms + r.bookkeeping_ms + r.other_ms
        assert parts == pytest.approx(r.latency_ms)
        assert min(r.run_ms, r.io_ms, r.handoff_ms, r.queue_ms, r.bookkeeping_ms, r.other_ms) >= 0
        assert r.unexplained_ms == pytest.approx(r.latency_ms - r.run_ms)
    assert b.critical_run_ms <= b.latency_ms
    assert b.predicted_ms == manifest.plan.predicted.latency_ms
    assert {p.lane for p in b.processors} == {"core0", "core1"}
    assert all(0 < p.busy_ns <= p.worker_ns <= p.window_ns for p in b.processors)


def _check_trace_event_format(obj: dict) -> None:
    """The JSON object form of the Trace Event Format, as the spec documents it."""
    assert set(obj) >= {"traceEvents"} and obj.get("displayTimeUnit") in ("ms", "ns")
    for ev in obj["traceEvents"]:
        assert (
            isinstance(ev["name"], str)
            and isinstance(ev["pid"], int)
            and isinstance(ev["tid"], int)
        )
        assert ev["ph"] in ("X", "M")
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], int | float) and isinstance(ev["dur"], int | float)
            assert ev["ts"] >= 0 and ev["dur"] >= 0
        else:
            assert ev["name"] in (
                "process_name",
                "thread_name",
                "process_sort_index",
                "thread_sort_index",
            )
            assert isinstance(ev["args"], dict)
    json.dumps(obj)
    assert trace_event_problems(obj) == []


def _threads(obj: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in obj["traceEvents"]
        if e["name"] == "thread_name"
    }


def _spans(obj: dict, pid: int, cat: str) -> list[dict]:
    return [e for e in obj["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["cat"] == cat]


def test_run_trace_writes_a_chrome_trace_with_predicted_spans(bundle, tmp_path):
    out = tmp_path / "trace.json"
    r = run_cli("run", str(bundle), "--repeat", "5", "--warmup", "1", "--trace", str(out))
    assert r.returncode == 0, r.stderr
    assert (
        "where the time goes" in r.stdout and "critical path" in r.stdout and str(out) in r.stdout
    )
    obj = json.loads(out.read_text())
    _check_trace_event_format(obj)
    threads = _threads(obj)
    procs = {
        p["name"]: p["processor"]
        for p in json.loads((bundle / "manifest.json").read_text())["parts"]
    }
    parts = _spans(obj, 1, "part")
    assert len(parts) == 5 * len(procs)  # N requests x P parts, one span each
    for e in parts:
        assert threads[(1, e["tid"])] == procs[e["name"]]
    by_lane = defaultdict(list)
    for e in parts:
        by_lane[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_lane.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    requests = {int(e["name"].split()[1]): e for e in _spans(obj, 1, "request")}
    assert len(requests) == 5
    for e in parts:
        req = requests[e["args"]["request"]]
        assert req["ts"] <= e["ts"] and e["ts"] + e["dur"] <= req["ts"] + req["dur"] + 1e-3
    runs = _spans(obj, 1, "run")
    assert len(runs) == len(parts)
    assert len(_spans(obj, 1, "queue")) + len(_spans(obj, 1, "handoff")) == len(parts)
    predicted = _spans(obj, 2, "part")
    assert sorted(e["name"] for e in predicted) == sorted(procs)
    for e in predicted:
        assert threads[(2, e["tid"])].split()[0] == procs[e["name"]]
    (pred_req,) = _spans(obj, 2, "request")
    assert pred_req["ts"] == min(e["ts"] for e in requests.values())  # aligned to the first request


def test_trace_request_out_of_range_is_a_usage_error(bundle, tmp_path):
    r = run_cli(
        "run",
        str(bundle),
        "--repeat",
        "2",
        "--trace",
        str(tmp_path / "t.json"),
        "--trace-request",
        "2",
    )
    assert r.returncode == 2 and "--trace-request" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "t.json").exists()


def test_detailed_trace_has_cpu_time_and_kernels_inside_run_calls(bundle):
    with load(bundle, detailed=True) as sess:
        rep = benchmark(sess, random_feeds(sess), repeat=3, warmup=1)
        manifest = sess.manifest
        assert (
            sess.end_detailed_trace().kernels == rep.trace.kernels
        )  # a second call reads nothing new
    trace = rep.trace
    assert len(trace.engine_runs) == 3 * len(manifest.parts)
    runs = {(p.request, p.part): p for p in trace.parts}
    for p in trace.parts:
        assert p.run_cpu_ns is not None and p.run_cpu_ns > 0
    for e in trace.engine_runs:
        p = runs[(e.request, e.part)]
        assert p.run_start_ns <= e.start_ns and e.start_ns + e.dur_ns <= p.run_end_ns
        assert 0 < e.kernels_ns <= e.dur_ns
    assert trace.kernels
    for k in trace.kernels:
        p = runs[(k.request, k.part)]
        assert p.run_start_ns <= k.start_ns and k.start_ns + k.dur_ns <= p.run_end_ns and k.op_type
    if platform.machine() in ("x86_64", "AMD64"):  # ORT's NCHWc layout exists on x86 only
        assert any(k.is_reorder for k in trace.kernels)
        assert any(p.reorders for p in rep.breakdown.parts)
    obj = chrome_trace(trace, manifest)
    _check_trace_event_format(obj)
    assert len(_spans(obj, 1, "engine")) == len(trace.engine_runs)
    assert len(_spans(obj, 1, "kernel")) + len(_spans(obj, 1, "reorder")) == len(trace.kernels)


def test_reset_stats_forgets_the_records(bundle):
    with load(bundle) as sess:
        feeds = random_feeds(sess)
        sess.run(feeds)
        sess.run(feeds)
        assert len(sess.trace_records().requests) == 2
        sess.reset_stats()
        assert sess.trace_records().parts == ()
        sess.run(feeds)
        trace = sess.trace_records()
        assert [r.request for r in trace.requests] == [2]
        assert {p.run_index for p in trace.parts} == {2}  # run counts survive the reset
        with pytest.raises(Exception, match="detailed=True"):
            sess.end_detailed_trace()


def test_statistics_and_records_keep_the_last_max_records_runs(bundle):
    """A long-lived Session keeps no more than ``max_records`` timings per part and per request
    (the statistics cover those), so serving millions of requests does not grow its memory."""
    with load(bundle, max_records=3) as sess:
        feeds = random_feeds(sess)
        for _ in range(5):
            sess.run(feeds)
        stats = sess.stats()
        assert stats.runs == 3 and {p.runs for p in stats.parts} == {3}
        assert [r.request for r in sess.trace_records().requests] == [2, 3, 4]


def test_a_stream_keeps_every_worker_s_queue_full(bundle):
    """A stream submits ``STREAM_WINDOW_PER_PART`` requests per part, plus as many, before it waits
    for the first result: with one request per part in flight, parts that alternate between two
    processors left a worker idle (a 4-part resnet18 pipeline on two cores measured 26.6 ms per
    request, against 22.0 ms with 20 in flight and 22.6 predicted)."""
    from edgesplit.runtime.session import STREAM_WINDOW_PER_PART

    with load(bundle) as sess:
        feeds = random_feeds(sess)
        pulled = 0

        def inputs():
            nonlocal pulled
            for _ in range(200):
                pulled += 1
                yield feeds

        stream = sess.run_stream(inputs())
        next(stream)
        in_flight = pulled
        assert sum(1 for _ in stream) == 199
    assert STREAM_WINDOW_PER_PART >= 2
    assert in_flight == STREAM_WINDOW_PER_PART * (len(sess.manifest.parts) + 1)
