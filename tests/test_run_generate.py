"""Generation from a decoder bundle compiled by ``edgesplit compile``: ``Session.generate`` gives
the plain ORT loop's tokens with the cache kept in place (0 copies), or moved and counted, at prompt
lengths other than the one compiled for; ``edgesplit run --generate`` prints the figures; bundles
that cannot generate are refused in one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_cli
from decoder_bundles import decoder_bundle

from edgesplit.errors import InputError
from edgesplit.generate.reference import greedy_plain, plain_setup
from edgesplit.model.zoo_decoder import SIZES
from edgesplit.runtime.session import load


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return decoder_bundle(tmp_path_factory.mktemp("small"), "decoder_small")


def _prompt(n: int, vocab: int = 2048, seed: int = 1) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def test_compile_keeps_the_decoders_lengths_dynamic(small):
    with load(small) as sess:
        (part,) = sess.manifest.parts
        spec = {t.name: t for t in part.inputs}
        assert spec["input_ids"].shape == (1, 1) and spec["input_ids"].dynamic_axes == (0, 1)
        assert spec["past_key_values.0.key"].dynamic_axes == (0, 2)
        assert {t.name: t.dynamic_axes for t in sess.manifest.inputs} == {
            t.name: t.dynamic_axes for t in part.inputs
        }
        # a run at another cache length than the one profiled (4) passes the input check
        c = SIZES["decoder_small"]
        feeds = {
            "input_ids": np.array([[3, 4, 5]], np.int64),
            "attention_mask": np.ones((1, 10), np.int64),
            "position_ids": np.array([[7, 8, 9]], np.int64),
        }
        for i in range(c.layers):
            for kv in ("key", "value"):
                feeds[f"past_key_values.{i}.{kv}"] = np.zeros(
                    (1, c.kv_heads, 7, c.head_dim), np.float32
                )
        out = sess.run(feeds)
    assert out["logits"].shape == (1, 3, c.vocab_size)
    assert out["present.0.key"].shape == (1, c.kv_heads, 10, c.head_dim)


@pytest.mark.parametrize(("chunk", "n"), [(0, 40), (16, 40), (0, 9)])
def test_session_generate_equals_plain_ort_loop(small, chunk, n):
    prompt = _prompt(n)
    sess_plain, config = plain_setup(onnx.load(small.parent / "decoder_small.onnx"))
    want = list(greedy_plain(sess_plain, config, prompt, 12))
    with load(small) as sess:
        tokens = sess.generate(prompt, 12, chunk_tokens=chunk)
        assert sess.last_generate_stats is None  # nothing ran before the first token is asked
        got = list(tokens)
        st = sess.last_generate_stats
        part = sess.stats().parts[0]
    assert got == want
    assert st.new_tokens == 12 and st.cache_copies == 0 and st.cache_handoffs > 0
    assert st.prefill_chunks == (1 if chunk == 0 else -(-n // chunk)) == len(st.prefill_ms)
    assert len(st.step_ms) == 11 and st.ttft_ms > 0 and st.decode_tokens_per_s > 0
    assert part.runs == st.prefill_chunks + 11


def test_moved_cache_is_counted(small):
    with load(small) as sess:
        list(sess.generate(_prompt(8), 5, move_cache=True))
        st = sess.last_generate_stats
    assert st.cache_copies == st.cache_handoffs - 8 > 0  # the first hand-off has no previous step


def test_bad_requests_are_refused_before_running(small):
    with load(small) as sess:
        with pytest.raises(InputError, match=r"in \[0, 2048\)"):
            sess.generate([1, 2048], 3)
        with pytest.raises(InputError, match="0 or more"):
            sess.generate([1, 2], -1)
        with pytest.raises(InputError, match="past the limit of 2048"):
            sess.generate([1] * 2040, 20)


@pytest.mark.slow
def test_compiled_fixed_length_and_multi_part_bundles_are_refused(tmp_path):
    fixed = decoder_bundle(tmp_path / "f", "decoder_tiny", fixed=True)
    with load(fixed) as sess, pytest.raises(InputError, match="compiled for fixed lengths"):
        sess.generate([1, 2], 3)
    three = decoder_bundle(tmp_path / "t", "decoder_tiny", parts=3)
    with load(three) as sess, pytest.raises(InputError, match="this one has 3 parts"):
        sess.generate([1, 2], 3)


def test_run_generate_prints_the_figures(small):
    r = run_cli("run", str(small), "--generate", "--prompt-tokens", "20", "--new-tokens", "6",
                "--chunk-tokens", "8")  # fmt: skip
    assert r.returncode == 0, r.stderr
    for figure in (
        "time to first token",
        "tokens/s",
        "ms per chunk",
        "ms per step: median",
        "per-part time",
        "cache copies between steps: 0 of",
        "tokens: ",
    ):
        assert figure in r.stdout, (figure, r.stdout)
    ids = r.stdout.split("tokens: ")[-1].split()
    assert len(ids) == 6 and all(t.isdigit() for t in ids)
