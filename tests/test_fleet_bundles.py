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
