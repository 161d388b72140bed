"""``edgesplit fleet plan --bundles``: a bundle per group that loads (and runs, for a group on its
device) and one Triton repository whose configs Triton's schema parses, with the fleet's batching;
groups on the same split point name the same Triton models."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format

import edgesplit

pytest.importorskip("tritonclient")

FLEET = """\
server: {spec: server-h200, slots: 2, max_batch: 8, max_queue_delay_ms: 2}
groups:
  - {name: pis, model: squeezenet, spec: raspberry-pi5, count: 400, rate_per_s: 20,
     band: {bandwidth_mbps: 400, rtt_ms: 2}, deadline_p95_ms: 60}
  - {name: pis2, model: squeezenet, spec: raspberry-pi5, count: 300, rate_per_s: 20,
     band: {bandwidth_mbps: 400, rtt_ms: 2}, deadline_p95_ms: 80}
  - {name: far, model: squeezenet, spec: raspberry-pi5, count: 2, rate_per_s: 1,
     band: {bandwidth_mbps: 1, rtt_ms: 200}, deadline_p95_ms: 1000}
"""


def _configs(repo) -> dict:
    from edgesplit.compile.triton import model_config_pb2

    pb = model_config_pb2()
    return {
        d.name: text_format.Parse((d / "config.pbtxt").read_text(), pb.ModelConfig())
        for d in sorted(repo.iterdir())
    }


def _check_batching(configs: dict, triton: dict) -> None:
    for name, cfg in configs.items():
        assert cfg.name == name
        if cfg.platform == "ensemble":
            continue
        assert [g.count for g in cfg.instance_group] == [triton["instances"]]
        if triton["max_batch"] > 1 and name not in triton["unbatched"]:
            assert cfg.max_batch_size % triton["max_batch"] == 0 and cfg.max_batch_size > 0
            delay_us = cfg.dynamic_batching.max_queue_delay_microseconds
            assert delay_us == round(triton["max_queue_delay_ms"] * 1e3)
        else:
            assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")


@pytest.mark.slow
def test_fleet_bundles_load_and_the_triton_repository_is_shared(tmp_path):
    from edgesplit.fleet.price import Server
    from edgesplit.workflows.fleet import plan_fleet_file
    from edgesplit.workflows.fleet_bundles import export_shared

    (tmp_path / "fleet.yaml").write_text(FLEET)
    out = tmp_path / "fleet"
    r = plan_fleet_file(tmp_path / "fleet.yaml", out, max_candidates=6, bundles=True).report
    assert r == json.loads((out / "fleet-report.json").read_text())
    rows = {g["group"]: g for g in r["groups"]}
    # the fleet this test is built for: two groups on one split point, one on its device
    assert rows["pis"]["server_part"] is not None
    assert rows["pis"]["server_part"] == rows["pis2"]["server_part"]
    assert rows["far"]["server_part"] is None
    triton = r["triton"]
    assert triton["groups"]["pis"] == triton["groups"]["pis2"] and triton["groups"]["pis"]
    assert triton["groups"]["far"] == []
    repo = out / "server" / "triton"
    configs = _configs(repo)
    assert set(triton["groups"]["pis"]) == set(configs)  # one set of models, not one per group
    assert all((repo / n / "1").is_dir() for n in configs)
    s = r["server"]
    assert triton["max_batch"] == (s["max_batch"] if s["max_queue_delay_ms"] > 0 else 1)
    assert triton["instances"] == s["slots"]
    _check_batching(configs, triton)

    for name in ("pis", "pis2", "far"):
        with edgesplit.load(out / "groups" / name / "bundle") as sess:
            assert sess is not None
    model = tmp_path / ".fleet.models" / "squeezenet.onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = ref.run(None, {ref.get_inputs()[0].name: x})
    with edgesplit.load(out / "groups" / "far" / "bundle") as sess:
        got = sess.run({ref.get_inputs()[0].name: x})
    for o, w in zip(ref.get_outputs(), want):
        np.testing.assert_allclose(got[o.name], w, rtol=1e-3, atol=1e-3)

    # the same bundles with batching on (the planner above may choose none at this load)
    again = tmp_path / "again"
    (again / "server").mkdir(parents=True)
    (again / "groups").symlink_to(out / "groups")
    groups = [(g, "", rows[g]["server_part"]) for g in ("pis", "pis2", "far")]
    batched = export_shared(again, groups, Server(slots=3, max_batch=8, max_queue_delay_ms=2.0))
    assert batched["max_batch"] == 8 and batched["max_queue_delay_ms"] == 2.0
    configs = _configs(again / "server" / "triton")
    _check_batching(configs, batched)
    assert any(c.HasField("dynamic_batching") for c in configs.values())


@pytest.mark.slow
def test_a_group_s_bundle_runs_against_the_fleet_s_shared_server_by_its_model_prefix(tmp_path):
    """The shared server names a split point's models ``<prefix>_<part>`` (as the Triton repository
    does): ``serve --model-prefix`` serves one group's bundle so, and another group on the same
    split point reaches it with its report's prefix (``run --server-model-prefix``); without the
    prefix the server has no such model and the call is refused (4xx), not sent to the fallback."""
    from edgesplit.errors import RemoteError
    from edgesplit.serve.server import ServeOptions, ServerThread
    from edgesplit.workflows.fleet import plan_fleet_file

    (tmp_path / "fleet.yaml").write_text(FLEET)
    out = tmp_path / "fleet"
    r = plan_fleet_file(tmp_path / "fleet.yaml", out, max_candidates=6, bundles=True).report
    triton = r["triton"]
    prefix = triton["model_prefixes"]["pis"]
    assert prefix == triton["model_prefixes"]["pis2"]  # one split point, one set of models
    served = out / "groups" / "pis" / "bundle"
    caller = out / "groups" / "pis2" / "bundle"
    remote = [p.name for p in edgesplit.open_bundle(caller).parts if p.remote]
    assert remote and {f"{prefix}_{p}" for p in remote} <= set(triton["groups"]["pis"])

    model = tmp_path / ".fleet.models" / "squeezenet.onnx"
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = ref.get_inputs()[0].name
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = ref.run(None, {name: x})
    with ServerThread(served, ServeOptions(port=0, model_prefix=prefix)) as srv:
        opts = {"remote": {"url": srv.url, "model_prefix": prefix}}
        with edgesplit.load(caller, executor_options=opts) as sess:
            got = sess.run({name: x})
            stats = sess.remote_stats()
        for o, w in zip(ref.get_outputs(), want):
            np.testing.assert_allclose(got[o.name], w, rtol=1e-3, atol=1e-3)
        # the plan's server part ran there (the band plans' parts stand by: an adaptive bundle)
        assert stats and set(stats) <= set(remote)
        assert all(s.remote_runs == 1 and s.local_runs == 0 for s in stats.values())
        with edgesplit.load(caller, executor_options={"remote": {"url": srv.url}}) as sess:
            with pytest.raises(RemoteError, match=f"part {next(iter(stats))}"):
                sess.run({name: x})
