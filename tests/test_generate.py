"""Generation over the zoo's decoders: layout, prefill + decode against a full forward pass, the
same greedy tokens as a plain ORT loop, the cache kept in place (copies counted), hostile
requests."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest

from edgesplit.errors import InputError
from edgesplit.generate import Generator
from edgesplit.generate.reference import forward, greedy_plain, plain_setup
from edgesplit.model import zoo
from edgesplit.model.zoo_decoder import SIZES, DecoderConfig, config_of


@functools.cache
def _model(name: str, seed: int = 0) -> onnx.ModelProto:
    return zoo.build(name, seed)


def _prompt(config: DecoderConfig, n: int, seed: int = 1) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, config.vocab_size, n)]


@pytest.mark.parametrize("name", ["decoder_tiny", "decoder_small"])
def test_decoder_has_genai_layout_and_passes_full_check(name: str):
    model = _model(name)
    onnx.checker.check_model(model, full_check=True)
    c = config_of(model)
    assert c == SIZES[name]
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    assert inputs[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert inputs[3:] == [
        f"past_key_values.{i}.{kv}" for i in range(c.layers) for kv in ("key", "value")
    ]
    assert outputs == ["logits"] + [
        f"present.{i}.{kv}" for i in range(c.layers) for kv in ("key", "value")
    ]
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names)


def test_decoder_build_is_deterministic_per_seed():
    a = _model("decoder_tiny", 0).SerializeToString()
    assert a == zoo.build("decoder_tiny", 0).SerializeToString()
    assert a != _model("decoder_tiny", 1).SerializeToString()


def test_decoder_sizes_span_tiny_to_100m_parameters():
    counts = {name: c.parameters for name, c in SIZES.items()}
    assert counts["decoder_tiny"] < 200_000
    assert 95e6 < counts["decoder_100m"] < 105e6
    c = SIZES["decoder_tiny"]
    weights = sum(
        int(np.prod(t.dims))
        for t in _model("decoder_tiny").graph.initializer
        if "rope" not in t.name
    )
    assert weights - 100 < c.parameters <= weights  # the rest: small int64 constants


@pytest.mark.parametrize("name", ["decoder_tiny", "decoder_small"])
@pytest.mark.parametrize("chunk", [0, 8, 16])
def test_prefill_plus_decode_equals_full_forward(name: str, chunk: int):
    """Logits of chunked prefill and then one decode step per token equal one forward pass."""
    model = _model(name)
    sess, c = plain_setup(model)
    tokens = _prompt(c, 30)
    full = forward(sess, c, np.asarray([tokens]))[0]  # (30, vocab)
    gen = Generator(model, chunk_tokens=chunk)
    from edgesplit.generate.kv import KVCache

    cache = KVCache.empty(c, gen.names)
    gen._returned = {}
    prompt, rest = tokens[:19], tokens[19:]
    width = chunk or len(prompt)
    got = []
    for start in range(0, len(prompt), width):
        got.append(gen._step(cache, prompt[start : start + width], width, start))
    for i, t in enumerate(rest):
        got.append(gen._step(cache, [t], 1, len(prompt) + i))
    want = [full[min(s + width, len(prompt)) - 1] for s in range(0, len(prompt), width)]
    want += [full[len(prompt) + i] for i in range(len(rest))]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["decoder_tiny", "decoder_small"])
@pytest.mark.parametrize("chunk", [0, 16, 32])
def test_generate_gives_the_plain_ort_loops_tokens(name: str, chunk: int):
    model = _model(name)
    sess, c = plain_setup(model)
    prompt = _prompt(c, 45)
    want = list(greedy_plain(sess, c, prompt, 24))
    gen = Generator(model, chunk_tokens=chunk)
    stream = gen.generate(prompt, 24)
    assert iter(stream) is stream  # an iterator: tokens come one at a time
    assert list(stream) == want
    stats = gen.last_stats
    assert stats.new_tokens == 24 and stats.prompt_tokens == 45
    assert stats.prefill_chunks == (-(-45 // chunk) if chunk else 1)
    assert stats.ttft_ms > 0 and stats.decode_tokens_per_s > 0


def test_cache_is_not_copied_between_steps_when_it_stays():
    model = _model("decoder_tiny")
    c = config_of(model)
    gen = Generator(model, chunk_tokens=16)
    list(gen.generate(_prompt(c, 40), 10))
    s = gen.last_stats
    steps = 3 + 9  # three prefill chunks, then nine decode steps (the tenth token needs none)
    assert s.cache_handoffs == steps * 2 * c.layers
    assert s.cache_copies == 0 and s.cache_copied_nbytes == 0


def test_cache_copies_are_counted_when_the_cache_moves():
    model = _model("decoder_tiny")
    c = config_of(model)
    gen = Generator(model, chunk_tokens=16, move_cache=True)
    tokens = list(gen.generate(_prompt(c, 40), 10))
    s = gen.last_stats
    assert s.cache_copies == (3 + 9 - 1) * 2 * c.layers  # every hand-off after the first step
    assert s.cache_copied_nbytes > 0
    assert tokens == list(Generator(model, chunk_tokens=16).generate(_prompt(c, 40), 10))


def test_eos_and_zero_new_tokens():
    model = _model("decoder_tiny")
    c = config_of(model)
    prompt = _prompt(c, 12)
    gen = Generator(model)
    first = list(gen.generate(prompt, 5))
    eos = first[-1]
    assert list(gen.generate(prompt, 5, eos_token_id=eos)) == first[: first.index(eos) + 1]
    assert list(gen.generate(prompt, 0)) == []


@pytest.mark.parametrize(
    ("ids", "new", "message"),
    [
        ([], 4, "non-empty sequence of integers"),
        ([[1, 2], [3, 4]], 4, "non-empty sequence of integers"),
        ([1.5, 2.0], 4, "non-empty sequence of integers"),
        ([1, 999999], 4, r"must lie in \[0, 256\)"),
        ([-1, 3], 4, "must lie in"),
        ([1, 2], -1, "0 or more"),
        ([1, 2], 2.5, "must be an int"),
        ([1, 2], True, "must be an int"),
        ([1, 2], 10_000, "past the limit of 512"),
    ],
)
def test_hostile_requests_are_refused_before_anything_runs(ids, new, message):
    gen = Generator(_model("decoder_tiny"))
    with pytest.raises(InputError, match=message):
        gen.generate(ids, new)
    assert gen.last_stats is None


def test_a_request_past_the_cache_limit_is_refused_with_the_sizes():
    gen = Generator(_model("decoder_tiny"), chunk_tokens=32, max_cache_tokens=100)
    with pytest.raises(InputError, match=r"grow to 163 positions \(40 prompt tokens, 100 new\)"):
        gen.generate(list(range(40)), 100)
    assert len(list(gen.generate(list(range(40)), 37))) == 37  # 64 slots + 36 steps = 100
