"""The model zoo: deterministic, valid, runnable models whose costs match the published ones."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgesplit.errors import InputError
from edgesplit.model import zoo
from edgesplit.model.graph import ModelGraph
from edgesplit.model.load import load_model

EXPECTED_OUTPUTS: dict[str, tuple[str, tuple[int, ...]]] = {
    "mobilenetv2": ("logits", (1, 1000)),
    "resnet18": ("logits", (1, 1000)),
    "resnet50": ("logits", (1, 1000)),
    "mobilenetv1": ("logits", (1, 1000)),
    "squeezenet": ("logits", (1, 1000)),
    "googlenet": ("logits", (1, 1000)),
    "alexnet": ("logits", (1, 1000)),
    "transformer": ("hidden", (1, 128, 256)),
    "transformer_large": ("hidden", (1, 64, 128)),
    "lstm": ("logits", (1, 10)),
    "chain_shrink": ("logits", (1, 10)),
    "tiny_dag": ("logits", (1, 10)),
}


# Seconds each to build, check or load with costs: in the full suite, not the quick subset.
_HEAVY = {"resnet18", "resnet50", "googlenet", "alexnet", "transformer", "transformer_large"}


def _names() -> list:
    """Every zoo model, the heavy ones marked slow."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in _HEAVY else n for n in EXPECTED_OUTPUTS]


@functools.cache
def _model(name: str, seed: int = 0) -> bytes:
    return zoo.build(name, seed).SerializeToString()


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):
    """name -> ModelGraph of the saved model, loaded once per name for the whole module."""
    folder = tmp_path_factory.mktemp("zoo")
    cache: dict[str, ModelGraph] = {}

    def get(name: str) -> ModelGraph:
        if name not in cache:
            cache[name] = load_model(zoo.save(name, folder / f"{name}.onnx"))
        return cache[name]

    return get


DECODERS = ["decoder_tiny", "decoder_small", "decoder_100m"]
"""Decoders of the zoo (dynamic shapes, a KV cache): tests/test_generate.py checks them."""


def test_registry_lists_every_model():
    assert zoo.names() == list(EXPECTED_OUTPUTS) + DECODERS
    for name, entry in zoo.ZOO.items():
        assert entry.name == name and entry.description


def test_unknown_name_is_an_input_error():
    with pytest.raises(InputError, match="unknown zoo model 'vgg16' .*resnet18"):
        zoo.build("vgg16")
    with pytest.raises(InputError):
        zoo.save("vgg16", "unused.onnx")


@pytest.mark.parametrize("name", _names())
def test_build_is_deterministic_per_seed(name: str):
    assert _model(name, 0) == zoo.build(name, 0).SerializeToString()
    assert _model(name, 0) != _model(name, 1)


@pytest.mark.parametrize("name", _names())
def test_model_passes_full_check(name: str):
    model = onnx.load_model_from_string(_model(name))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert [i.name for i in model.graph.input] == ["input"]
    node_names = [n.name for n in model.graph.node]
    assert all(node_names) and len(set(node_names)) == len(node_names)


@pytest.mark.parametrize("name", _names())
def test_model_runs_in_onnxruntime(name: str):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(_model(name), opts, providers=["CPUExecutionProvider"])
    (inp,) = sess.get_inputs()
    x = np.random.default_rng(7).standard_normal(inp.shape).astype(np.float32)
    (out,) = sess.run(None, {inp.name: x})
    out_name, shape = EXPECTED_OUTPUTS[name]
    assert sess.get_outputs()[0].name == out_name
    assert out.shape == shape and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert 1e-3 < float(out.std()) < 100  # neither dead nor exploding


@pytest.mark.parametrize("name", _names())
def test_saved_model_loads_with_costs(name: str, loaded):
    graph = loaded(name)
    assert graph.total_flops > 0
    assert all(n.flops >= 0 for n in graph.nodes)
    assert graph.outputs == (EXPECTED_OUTPUTS[name][0],)


def test_save_writes_the_built_bytes(tmp_path: Path):
    path = zoo.save("tiny_dag", tmp_path / "sub" / "tiny.onnx", seed=3)
    assert path == tmp_path / "sub" / "tiny.onnx"
    assert path.read_bytes() == _model("tiny_dag", 3)


@pytest.mark.parametrize(
    ("name", "gmacs", "tolerance"),
    [
        pytest.param(*case, marks=pytest.mark.slow) if case[0] in _HEAVY else case
        for case in [
            ("resnet18", 1.82, 0.10),
            ("mobilenetv2", 0.30, 0.10),
            ("resnet50", 4.1, 0.10),  # torchvision's count for v1.5
            ("mobilenetv1", 0.569, 0.10),  # MobileNets paper, table 8
            ("squeezenet", 0.35, 0.10),
            ("googlenet", 1.5, 0.15),  # 5x5 convs as in the paper (torchvision has 3x3 there)
            ("alexnet", 0.71, 0.10),  # torchvision's count
        ]
    ],
)
def test_flops_match_published_counts(name: str, gmacs: float, tolerance: float, loaded):
    assert loaded(name).total_flops == pytest.approx(2 * gmacs * 1e9, rel=tolerance)


@pytest.mark.slow
def test_googlenet_has_four_way_branches(loaded):
    graph = loaded("googlenet")
    assert any(len(users) == 4 for t, users in graph.consumers.items() if t in graph.producer)
    assert any(n.op_type == "Concat" and len(n.inputs) == 4 for n in graph.nodes)


@pytest.mark.slow
def test_resnet18_and_mobilenetv2_have_skips(loaded):
    for name, adds in (("resnet18", 8), ("mobilenetv2", 10)):
        graph = loaded(name)
        assert sum(n.op_type == "Add" for n in graph.nodes) == adds
        assert not graph.is_chain()


@pytest.mark.slow
def test_transformer_large_has_over_1000_nodes(loaded):
    graph = loaded("transformer_large")
    assert len(graph.nodes) >= 1000
    ops = {n.op_type for n in graph.nodes}
    assert {"MatMul", "Softmax", "LayerNormalization", "Erf", "Transpose", "Reshape"} <= ops


@pytest.mark.slow
def test_transformer_attention_is_spelled_out(loaded):
    graph = loaded("transformer")
    ops = [n.op_type for n in graph.nodes]
    assert ops.count("Softmax") == 4 and ops.count("LayerNormalization") == 8
    assert ops.count("Erf") == 4  # one GELU per layer, not fused


def test_lstm_has_lstm_and_gru(loaded):
    ops = [n.op_type for n in loaded("lstm").nodes]
    assert ops.count("LSTM") == 1 and ops.count("GRU") == 1 and ops[-1] == "Gemm"


def test_chain_shrink_is_a_chain_with_shrinking_activations(loaded):
    graph = loaded("chain_shrink")
    assert graph.is_chain()
    pools = [n for n in graph.nodes if n.op_type == "MaxPool"]
    sizes = [n.bytes_written for n in pools]
    assert len(pools) == 5 and sizes == sorted(sizes, reverse=True) and sizes[0] > 8 * sizes[-1]
    convs = [n.flops for n in graph.nodes if n.op_type == "Conv"][1:]
    assert max(convs) < 1.1 * min(convs)  # each later stage costs about the same
    assert [n.op_type for n in graph.nodes[-2:]] == ["Flatten", "Gemm"]


def test_tiny_dag_is_small_and_branchy(loaded):
    graph = loaded("tiny_dag")
    assert 8 <= len(graph.nodes) <= 12
    assert not graph.is_chain()
    assert {"Conv", "Add", "Concat", "Gemm"} <= {n.op_type for n in graph.nodes}
