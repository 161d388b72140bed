"""Fused operators in zoo decoders: fewer kernels, the same logits and tokens."""

from __future__ import annotations

import numpy as np
import pytest

from edgesplit.generate import Generator
from edgesplit.generate.reference import forward, greedy_plain, plain_setup
from edgesplit.model import zoo
from edgesplit.model.attention_fusion import fuse_attention, fuse_skip_norm
from edgesplit.model.decoder_fusion import fuse_head_split, fuse_rotary
from edgesplit.model.zoo_decoder import config_of


@pytest.mark.parametrize("name", ["decoder_tiny", "decoder_small"])
def test_fused_rotary_keeps_the_logits_and_tokens(name):
    model = zoo.build(name, 0)
    fused, count = fuse_rotary(model)
    layers = config_of(model).layers
    assert count == 2 * layers  # q and k of every layer
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("RotaryEmbedding") == count and "Neg" not in ops and "Slice" not in ops
    ids = np.random.default_rng(0).integers(0, config_of(model).vocab_size, (1, 40))
    want, got = (forward(*plain_setup(m), ids) for m in (model, fused))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    prompt = list(ids[0])  # 40 tokens: a padded second chunk of 32
    assert list(Generator(fused).generate(prompt, 8)) == list(Generator(model).generate(prompt, 8))


def test_fusing_twice_or_a_model_without_rotary_changes_nothing():
    fused, count = fuse_rotary(zoo.build("decoder_tiny", 0))
    again, none = fuse_rotary(fused)
    assert count > 0 and none == 0
    assert again.SerializeToString() == fused.SerializeToString()


def test_heads_split_once_after_one_qkv_projection(monkeypatch):
    """int4 graphs read q, k and v through one MatMulNBits: split into heads once, bit for bit
    what splitting first gave, with 4 operators fewer a layer."""
    import logging

    import edgesplit.precision.int4 as int4

    logging.disable(logging.INFO)
    model = zoo.build("decoder_small", 0)
    fused = int4.quantize_int4(model, method="minmax_offset", accuracy_level=0)
    monkeypatch.setattr(int4, "fuse_head_split", lambda m: (m, 0))
    plain = int4.quantize_int4(model, method="minmax_offset", accuracy_level=0)
    logging.disable(logging.NOTSET)
    layers = config_of(model).layers
    assert fuse_head_split(plain)[1] == layers and fuse_head_split(fused)[1] == 0
    assert len(plain.graph.node) - len(fused.graph.node) == 4 * layers
    heads = [n for n in fused.graph.node if n.op_type == "Split" and n.attribute[0].i == 1]
    assert len(heads) == layers
    ids = np.random.default_rng(1).integers(0, config_of(model).vocab_size, (1, 24))
    want, got = (forward(*plain_setup(m), ids) for m in (plain, fused))
    np.testing.assert_array_equal(got, want)


def _int4(model):
    import logging

    from edgesplit.precision.int4 import quantize_int4

    logging.disable(logging.INFO)
    try:
        return quantize_int4(model, method="minmax_offset", accuracy_level=0)
    finally:
        logging.disable(logging.NOTSET)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _decode_logits(model, prompt, steps, prefill_model=None):
    """The prompt's last logits, then each greedy decode step's, through :class:`Generator`
    (the prompt prefilled by ``prefill_model``'s generator when given)."""
    gen = Generator(model)
    cache, logits = Generator(prefill_model or model).prefill(prompt)
    out, position = [logits], len(prompt)
    for _ in range(steps):
        out.append(gen.decode_step(cache, int(np.argmax(out[-1])), position))
        position += 1
    return out


@pytest.mark.parametrize("name", ["decoder_tiny", "decoder_small"])
def test_fused_attention_keeps_the_logits_and_tokens(name):
    """One GroupQueryAttention a layer: prefill and every decode step after a padded chunk give
    the unfused logits, and greedy tokens are those of the plain ORT loop on the unfused model."""
    model = zoo.build(name, 0)
    config = config_of(model)
    fused, count = fuse_attention(model)
    assert count == config.layers
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("GroupQueryAttention") == config.layers
    for gone in ("Softmax", "Reshape", "Concat", "RotaryEmbedding", "Where", "Neg"):
        assert gone not in ops, gone
    assert ops.count("Transpose") == 1  # the tied head's
    # per layer: 3 into heads (Reshape, Transpose), 2 rotary embeddings of 7, 2 cache Concats and
    # 10 of attention proper, for one GQA; once: the mask (15) and the rope tables (6), for the
    # 12 nodes that count the cache
    assert len(model.graph.node) - len(fused.graph.node) == 31 * config.layers + 21 - 12
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (1, 40))
    want, got = (forward(*plain_setup(m), ids) for m in (model, fused))
    _close(got, want)
    prompt = [int(t) for t in ids[0]]  # 40 tokens: a second chunk of 32 padded after 8
    for w, g in zip(_decode_logits(model, prompt, 8), _decode_logits(fused, prompt, 8)):
        _close(g, w)
    plain = list(greedy_plain(*plain_setup(model), prompt, 12))
    assert list(Generator(fused).generate(prompt, 12)) == plain
    assert list(Generator(fused, chunk_tokens=0).generate(prompt, 12)) == plain


def test_fused_attention_continues_a_cache_the_unfused_model_prefilled():
    """Caches are interchangeable: the unfused model's padded slots are masked, the fused model's
    are past its real tokens and overwritten."""
    model = zoo.build("decoder_small", 0)
    fused = fuse_attention(model)[0]
    prompt = [int(t) for t in np.random.default_rng(2).integers(0, 2048, 37)]
    want = _decode_logits(model, prompt, 6)
    for prefill_model, decode_model in ((model, fused), (fused, model)):
        for w, g in zip(want, _decode_logits(decode_model, prompt, 6, prefill_model)):
            _close(g, w)


def test_fused_attention_reads_packed_qkv_of_an_int4_graph():
    model = zoo.build("decoder_small", 0)
    int4 = _int4(model)
    fused, count = fuse_attention(int4)
    gqa = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert count == len(gqa) == config_of(model).layers
    assert all(list(n.input[1:3]) == ["", ""] for n in gqa)  # q, k and v packed in one input
    assert not any(n.op_type == "Split" and n.attribute[0].i == 1 for n in fused.graph.node)
    ids = np.random.default_rng(1).integers(0, config_of(model).vocab_size, (1, 24))
    want, got = (forward(*plain_setup(m), ids) for m in (int4, fused))
    _close(got, want)
    prompt = [int(t) for t in ids[0]]
    for w, g in zip(_decode_logits(int4, prompt, 6), _decode_logits(fused, prompt, 6)):
        _close(g, w)


def test_fused_skip_norm_keeps_the_logits_and_tokens():
    model = zoo.build("decoder_small", 0)
    config = config_of(model)
    attention = fuse_attention(model)[0]
    fused, count = fuse_skip_norm(attention)
    # every norm but the first reads a residual sum: 2 a layer, the final norm, less the first
    assert count == 2 * config.layers
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("SkipSimplifiedLayerNormalization") == count
    assert ops.count("Pow") == 1  # the first norm's, which ORT fuses by itself
    assert len(attention.graph.node) - len(fused.graph.node) == 6 * count
    ids = np.random.default_rng(3).integers(0, config.vocab_size, (1, 40))
    want, got = (forward(*plain_setup(m), ids) for m in (model, fused))
    _close(got, want)
    prompt = [int(t) for t in ids[0]]
    for w, g in zip(_decode_logits(model, prompt, 6), _decode_logits(fused, prompt, 6)):
        _close(g, w)
    assert list(Generator(fused).generate(prompt, 12)) == list(
        greedy_plain(*plain_setup(model), prompt, 12)
    )


def test_fusing_attention_or_norms_twice_or_in_a_cnn_changes_nothing():
    once = fuse_skip_norm(fuse_attention(zoo.build("decoder_tiny", 0))[0])[0]
    cnn = zoo.build("squeezenet", 0)
    for fuse in (fuse_attention, fuse_skip_norm):
        for model in (once, cnn):
            again, count = fuse(model)
            assert count == 0
            assert again.SerializeToString() == model.SerializeToString()
