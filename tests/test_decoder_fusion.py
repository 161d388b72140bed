"""Fused operators in zoo decoders: fewer kernels, the same logits and tokens."""

from __future__ import annotations

import numpy as np
import pytest

from edgesplit.generate import Generator
from edgesplit.generate.reference import forward, plain_setup
from edgesplit.model import zoo
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
