"""Decode tokens/s of a decoder in fp32 and in int4 (MatMulNBits) on this host, side by side.

The two generators run in alternating rounds (fp32, int4, fp32, ...) on the same prompt, so that
load from other work on the shared cores falls on both; each round is one greedy generation of
``--new-tokens`` after a ``--prompt-tokens`` prompt, and the table gives the median per model.
The model is SmolLM2-135M with trained weights when its GGUF is installed (see
edgesplit/model/gguf_decoder.py), else the zoo's seeded decoder_100m. The baseline is fp32 with the
same runtime (edgesplit's Generator over plain ONNX Runtime, its default threads).

    python benchmarks/generate_int4.py [--model smollm2|decoder_100m|...] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import numpy as np


def build(name: str):
    from edgesplit.model import zoo

    if name == "smollm2":
        from edgesplit.model.gguf_decoder import smollm2

        return smollm2()
    return zoo.build(name, 0)


def main() -> None:
    from edgesplit.generate import Generator
    from edgesplit.model.gguf_decoder import smollm2_path
    from edgesplit.model.zoo_decoder import config_of
    from edgesplit.precision.int4 import quantize_int4

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2" if smollm2_path() else "decoder_100m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--chunk-tokens", type=int, default=32)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    logging.disable(logging.INFO)
    fp32 = build(args.model)
    q = quantize_int4(fp32)
    config = config_of(fp32)
    prompt = np.random.default_rng(0).integers(0, config.vocab_size, args.prompt_tokens)
    gens = {
        "fp32": Generator(fp32, chunk_tokens=args.chunk_tokens),
        "int4": Generator(q, chunk_tokens=args.chunk_tokens),
    }
    rates: dict[str, list[float]] = {k: [] for k in gens}
    ttft: dict[str, list[float]] = {k: [] for k in gens}
    for gen in gens.values():  # warm-up
        list(gen.generate(prompt, 4))
    for _ in range(args.rounds):
        for name, gen in gens.items():
            list(gen.generate(prompt, args.new_tokens))
            rates[name].append(gen.last_stats.decode_tokens_per_s)
            ttft[name].append(gen.last_stats.ttft_ms)
    rows = {
        k: {
            "decode_tokens_per_s": round(statistics.median(rates[k]), 2),
            "ttft_ms": round(statistics.median(ttft[k]), 1),
            "rounds_tokens_per_s": [round(r, 2) for r in rates[k]],
        }
        for k in gens
    }
    speedup = rows["int4"]["decode_tokens_per_s"] / rows["fp32"]["decode_tokens_per_s"]
    print(f"{args.model}: {config.parameters / 1e6:.0f}M parameters, prompt {args.prompt_tokens}, "
          f"{args.new_tokens} new tokens, chunk {args.chunk_tokens}, {args.rounds} rounds "
          f"alternating, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"{'precision':<10}{'decode tok/s':>14}{'TTFT ms':>10}   per round")
    for k, r in rows.items():
        print(f"{k:<10}{r['decode_tokens_per_s']:>14.1f}{r['ttft_ms']:>10.1f}   "
              f"{r['rounds_tokens_per_s']}")  # fmt: skip
    print(f"int4 decode is {speedup:.2f}x fp32 (baseline: fp32, same runtime and threads)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"model": args.model, "rows": rows, "speedup": round(speedup, 3)}, f, indent=1
            )


if __name__ == "__main__":
    main()
