"""Decode tokens/s and time to first token: edgesplit's Generator, ONNX Runtime GenAI and plain ORT,
side by side on the same model file.

One ONNX file is written once; GenAI loads it from its folder (``genai_config.json`` from
edgesplit.generate.genai), edgesplit's Generator and the plain loop
(edgesplit.generate.reference) load the same file. Each round runs the three in turn (edgesplit,
GenAI, plain; each goes first in a third of the rounds) on the same prompt, so that load from
other work on the shared cores falls on all of them; a round is one greedy generation of
``--new-tokens`` after a ``--prompt-tokens`` prompt of seeded random ids, with no end token. The
tokens of the three are checked equal in every round. All three run ORT's CPU provider with the
same intra-op threads (``--threads``).

    flock /tmp/edgesplit-timing.lock python benchmarks/generate_vs_genai.py \
        [--model decoder_100m|smollm2] [--rounds 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def build(name: str):
    from edgesplit.model import zoo

    if name == "smollm2":
        from edgesplit.model.gguf_decoder import smollm2

        return smollm2()
    return zoo.build(name, 0)


def plain_timed(sess, config, prompt: list[int], new_tokens: int) -> tuple[list[int], float, float]:
    """edgesplit.generate.reference.greedy_plain with the same two timings as the others:
    (tokens, ttft_ms, decode_ms)."""
    from edgesplit.generate.reference import cache_names, empty_cache

    start = time.perf_counter()
    names = [o.name for o in sess.get_outputs()]
    past = empty_cache(config)
    ids = np.asarray([prompt], dtype=np.int64)
    done, out, first = 0, [], start
    while len(out) < new_tokens:
        seq = ids.shape[1]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, done + seq), np.int64),
            "position_ids": np.arange(done, done + seq, dtype=np.int64)[None],
            **past,
        }
        results = dict(zip(names, sess.run(None, feeds)))
        past = {p: results[q] for p, q in cache_names(config)}
        done += seq
        out.append(int(results["logits"][0, -1].argmax()))
        if len(out) == 1:
            first = time.perf_counter()
        ids = np.asarray([[out[-1]]], dtype=np.int64)
    end = time.perf_counter()
    return out, (first - start) * 1e3, (end - first) * 1e3


def main() -> None:
    from edgesplit.generate import Generator
    from edgesplit.generate.genai import GenAIGenerator, version, write_genai_folder
    from edgesplit.generate.reference import session
    from edgesplit.model.zoo_decoder import config_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="decoder_100m")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--chunk-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="ORT intra-op threads, all three")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    logging.disable(logging.INFO)
    model = build(args.model)
    config = config_of(model)
    prompt = [
        int(t) for t in np.random.default_rng(0).integers(0, config.vocab_size, args.prompt_tokens)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_genai_folder(model, tmp, threads=args.threads)
        path = str(Path(folder) / "model.onnx")
        del model
        gen = Generator(path, chunk_tokens=args.chunk_tokens, threads=args.threads)
        genai = GenAIGenerator(folder)
        plain = session(path, args.threads)

        def run_edgesplit():
            tokens = list(gen.generate(prompt, args.new_tokens))
            return tokens, gen.last_stats.ttft_ms, gen.last_stats.decode_ms

        def run_genai():
            r = genai.generate(prompt, args.new_tokens)
            return r.tokens, r.ttft_ms, r.decode_ms

        runners = {
            "edgesplit": run_edgesplit,
            "genai": run_genai,
            "plain-ort": lambda: plain_timed(plain, config, prompt, args.new_tokens),
        }
        for run in runners.values():  # warm-up
            run()
        rates: dict[str, list[float]] = {k: [] for k in runners}
        ttft: dict[str, list[float]] = {k: [] for k in runners}
        order = list(runners)
        for r in range(args.rounds):
            tokens = {}
            for name in order[r % 3 :] + order[: r % 3]:  # each goes first in a third of rounds
                tokens[name], t_ms, d_ms = runners[name]()
                rates[name].append((len(tokens[name]) - 1) / (d_ms / 1e3))
                ttft[name].append(t_ms)
            if not tokens["edgesplit"] == tokens["genai"] == tokens["plain-ort"]:
                raise SystemExit(f"tokens differ: {tokens}")
    rows = {
        k: {
            "decode_tokens_per_s": round(statistics.median(rates[k]), 2),
            "ttft_ms": round(statistics.median(ttft[k]), 1),
            "rounds_tokens_per_s": [round(r, 1) for r in rates[k]],
            "rounds_ttft_ms": [round(t) for t in ttft[k]],
        }
        for k in runners
    }
    ratio = rows["edgesplit"]["decode_tokens_per_s"] / rows["genai"]["decode_tokens_per_s"]
    per_round = [a / b for a, b in zip(rates["edgesplit"], rates["genai"])]
    print(f"{args.model}: {config.parameters / 1e6:.0f}M parameters fp32, prompt "
          f"{args.prompt_tokens}, {args.new_tokens} new tokens, edgesplit chunk "
          f"{args.chunk_tokens}, {args.threads} intra-op threads, {args.rounds} rounds "
          f"alternating, onnxruntime-genai {version()}, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"{'runtime':<11}{'decode tok/s':>14}{'TTFT ms':>10}   per round tok/s")
    for k, r in rows.items():
        print(f"{k:<11}{r['decode_tokens_per_s']:>14.1f}{r['ttft_ms']:>10.1f}   "
              f"{r['rounds_tokens_per_s']}")  # fmt: skip
    lo, hi = min(per_round), max(per_round)
    print(f"edgesplit decode is {ratio:.2f}x GenAI's (median of the rates); per round "
          f"{lo:.2f}x to {hi:.2f}x; the same tokens in every round")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "model": args.model,
                    "threads": args.threads,
                    "onnxruntime_genai": version(),
                    "rows": rows,
                    "ratio_edgesplit_over_genai": round(ratio, 3),
                    "ratio_per_round": [round(r, 3) for r in per_round],
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
