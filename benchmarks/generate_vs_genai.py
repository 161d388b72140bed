"""Decode tokens/s and time to first token: edgesplit's Generator, ONNX Runtime GenAI and plain ORT,
side by side on the same model file.

One ONNX file is written once; GenAI loads it from its folder (``genai_config.json`` from
edgesplit.generate.genai), edgesplit's Generator and the plain loop
(edgesplit.generate.reference) load the same file. A round is one greedy generation by each of
``--new-tokens`` after a ``--prompt-tokens`` prompt of seeded random ids, with no end token, the
three interleaved token by token (each goes first in a third of the rounds), so that load from
other work on the shared cores falls on all of them alike. Each ``next`` is timed: the first is
the time to first token (prefill), the others the decode steps. The tokens of the three are
checked equal in every round. All three run ORT's CPU provider with the
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
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def build(name: str):
    from edgesplit.model import zoo

    if name == "smollm2":
        from edgesplit.model.gguf_decoder import smollm2

        return smollm2()
    return zoo.build(name, 0)


def interleaved(streams: dict[str, Iterator[int]]) -> dict[str, tuple[list[int], list[float]]]:
    """Advance the streams one token each in turn until all end: (tokens, ms per token) each.

    A token's time is its ``next`` call: the first one runs the prefill, each later one a decode
    step. Stepping in turn puts the others' load, and the machine's, on all of them alike.
    """
    out: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in streams}
    active = dict(streams)
    while active:
        for name, stream in list(active.items()):
            start = time.perf_counter()
            try:
                token = next(stream)
            except StopIteration:
                del active[name]
                continue
            out[name][1].append((time.perf_counter() - start) * 1e3)
            out[name][0].append(token)
    return out


def main() -> None:
    from edgesplit.generate import Generator
    from edgesplit.generate.genai import GenAIGenerator, version, write_genai_folder
    from edgesplit.generate.reference import greedy_plain, session
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

        streams = {
            "edgesplit": lambda: gen.generate(prompt, args.new_tokens),
            "genai": lambda: genai.stream(prompt, args.new_tokens),
            "plain-ort": lambda: greedy_plain(plain, config, prompt, args.new_tokens),
        }
        order = list(streams)
        interleaved({k: streams[k]() for k in order})  # warm-up
        rates: dict[str, list[float]] = {k: [] for k in streams}
        ttft: dict[str, list[float]] = {k: [] for k in streams}
        for r in range(args.rounds):
            names = order[r % 3 :] + order[: r % 3]  # each goes first in a third of the rounds
            got = interleaved({k: streams[k]() for k in names})
            for k, (_, ms) in got.items():
                ttft[k].append(ms[0])
                rates[k].append((len(ms) - 1) / (sum(ms[1:]) / 1e3))
            tokens = {k: got[k][0] for k in order}
            if not tokens["edgesplit"] == tokens["genai"] == tokens["plain-ort"]:
                raise SystemExit(f"tokens differ: {tokens}")
    rows = {
        k: {
            "decode_tokens_per_s": round(statistics.median(rates[k]), 2),
            "ttft_ms": round(statistics.median(ttft[k]), 1),
            "rounds_tokens_per_s": [round(r, 1) for r in rates[k]],
            "rounds_ttft_ms": [round(t) for t in ttft[k]],
        }
        for k in streams
    }
    ratio = rows["edgesplit"]["decode_tokens_per_s"] / rows["genai"]["decode_tokens_per_s"]
    per_round = [a / b for a, b in zip(rates["edgesplit"], rates["genai"])]
    print(f"{args.model}: {config.parameters / 1e6:.0f}M parameters fp32, prompt "
          f"{args.prompt_tokens}, {args.new_tokens} new tokens, edgesplit chunk "
          f"{args.chunk_tokens}, {args.threads} intra-op threads, {args.rounds} rounds "
          f"interleaved token by token, onnxruntime-genai {version()}, "
          f"{time.strftime('%Y-%m-%d')}")  # fmt: skip
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
