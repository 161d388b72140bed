"""``edgesplit export-triton``: a Triton model repository whose configs Triton's own schema accepts."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
from google.protobuf import text_format
from netlab import make_bundle, single_tensor_cuts

from edgesplit.compile.triton import export_triton, model_config_pb2
from edgesplit.errors import BundleError

pytest.importorskip("tritonclient")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("triton")
    path = zoo.save("squeezenet", d / "squeezenet.onnx")
    cuts = single_tensor_cuts(onnx.load(path))
    cuts = [cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]]
    return {
        "chain": make_bundle(path, d / "chain", cuts, [False, True, True]),
        "local": make_bundle(path, d / "local", cuts, [False, False, False]),
        "cuts": cuts,
    }


def parse(path) -> object:
    return text_format.Parse(path.read_text(), model_config_pb2().ModelConfig())


def test_export_writes_configs_triton_parses_and_an_ensemble(bundles, tmp_path):
    repo = tmp_path / "repo"
    result = export_triton(bundles["chain"], repo)
    assert result.models == ("p1", "p2") and result.ensembles == ("ensemble",)
    assert sorted(p.name for p in repo.iterdir()) == ["ensemble", "p1", "p2"]
    pb = model_config_pb2()
    a, b = bundles["cuts"]
    for name, (inp, out) in {"p1": (a, b), "p2": (b, "logits")}.items():
        cfg = parse(repo / name / "config.pbtxt")
        assert cfg.name == name and cfg.platform == "onnxruntime_onnx" and cfg.backend == "onnxruntime"
        assert cfg.max_batch_size == 0
        assert [i.name for i in cfg.input] == [inp] and [o.name for o in cfg.output] == [out]
        assert all(t.data_type == pb.DataType.Value("TYPE_FP32") for t in [*cfg.input, *cfg.output])
        assert list(cfg.output[0].dims)[:1] == [1] and len(cfg.input[0].dims) == 4
        assert (repo / name / "1" / "model.onnx").read_bytes() == (
            bundles["chain"] / "parts" / f"{name}.onnx"
        ).read_bytes()
    ens = parse(repo / "ensemble" / "config.pbtxt")
    assert ens.platform == "ensemble"
    assert [i.name for i in ens.input] == [a] and [o.name for o in ens.output] == ["logits"]
    steps = ens.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["p1", "p2"]
    assert dict(steps[0].output_map) == {b: b} and dict(steps[1].input_map) == {b: b}
    assert (repo / "ensemble" / "1").is_dir()


def test_export_replaces_a_repository_and_refuses_bundles_without_server_parts(bundles, tmp_path):
    repo = tmp_path / "repo"
    (repo / "stale").mkdir(parents=True)
    export_triton(bundles["chain"], repo)
    assert not (repo / "stale").exists()
    with pytest.raises(BundleError, match="no server parts"):
        export_triton(bundles["local"], tmp_path / "other")
    assert not (tmp_path / "other").exists()
    result = export_triton(bundles["local"], tmp_path / "all", all_parts=True)
    assert result.models == ("p0", "p1", "p2") and result.ensembles == ("ensemble",)


def test_export_triton_cli(bundles, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "edgesplit", "export-triton", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = cli(str(bundles["chain"]), "-o", str(tmp_path / "repo"))
    assert r.returncode == 0, r.stderr
    assert "2 model(s) (p1, p2), ensemble(s) ensemble" in r.stdout
    r = cli(str(bundles["local"]), "-o", str(tmp_path / "repo2"))
    assert r.returncode == 2 and "no server parts" in r.stderr
