"""Decode tokens/s of a decoder in fp32 and in int4 variants (MatMulNBits) on this host.

The generators run in alternating rounds (fp32, then each int4 variant, then fp32 again ...) on
the same prompt, so that load from other work on the shared cores falls on all of them; each
round is one greedy generation of ``--new-tokens`` after a ``--prompt-tokens`` prompt, and the
table gives the median per variant. The model is SmolLM2-135M with trained weights when its GGUF
is installed (see edgesplit/model/gguf_decoder.py), else the zoo's seeded decoder_100m. The
baseline is fp32 with the same runtime (edgesplit's Generator over plain ONNX Runtime, its
default threads). ``--accuracy`` adds each variant's logit SNR and next-token top-1 agreement
with fp32 on the held-out prompts (SmolLM2 only: it needs the vocabulary).

Variants (``--variants``, comma-separated):

- ``rtn``: :func:`~edgesplit.precision.int4.quantize_int4` with its defaults;
- ``rtn-int4head``, ``rtn-asym``, ``kquant``, ``kquant-l0``, ``minmax``: other requantizations;
- ``gguf``: the GGUF file's own blocks, int8 activations (accuracy_level 4), 8-bit head;
- ``gguf-head-fp32``: the same with the head in float32;
- ``gguf-head-l0``: the same with float32 activations into the 8-bit head;
- ``gguf-l0``: the file's blocks with float32 activations everywhere (reproduces fp32);
- ``gguf-rescore``: ``gguf`` with the 8-bit head's 16 best tokens scored again in float32
  (:mod:`edgesplit.precision.head_rescore`);
- ``gguf-int4head-rescore``: the same over a 4-bit head (the file's head requantized);
- ``gguf-int4head-rescore-OFFSETS`` for OFFSETS ``centered``, ``digits2``, ``digits3``, ``int8``:
  the same with the Q4_1 minimums computed that way (``edgesplit.precision.int4.OFFSETS``).

``--rotary fused`` runs every model, fp32 included, with its rotary embeddings fused into ORT's
``RotaryEmbedding`` (:func:`edgesplit.model.decoder_fusion.fuse_rotary`); ``--rotary both`` runs
each model both ways (the fused ones named ``NAME+rotary``, each compared with ``fp32+rotary``).

On a shared machine, run it under ``flock /tmp/edgesplit-timing.lock`` so that one timing run
at a time uses the cores:

    flock /tmp/edgesplit-timing.lock python benchmarks/generate_int4.py [--rounds 5] [--accuracy]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx

Build = Callable[[onnx.ModelProto, str], onnx.ModelProto]


def _quantized(**kwargs) -> Build:
    def build(fp32: onnx.ModelProto, path: str) -> onnx.ModelProto:
        from edgesplit.precision.int4 import quantize_int4

        return quantize_int4(fp32, **kwargs)

    return build


def _gguf(**kwargs) -> Build:
    def build(fp32: onnx.ModelProto, path: str) -> onnx.ModelProto:
        from edgesplit.model.gguf_decoder import load_gguf_int4

        return load_gguf_int4(path, "smollm2", **kwargs)[0]

    return build


TOP_K = 16
"""Candidates the rescoring variants score again (``rescore_top_k``)."""

VARIANTS: dict[str, Build] = {
    "rtn": _quantized(),
    "rtn-int4head": _quantized(method="rtn_sym", head="int4"),
    "rtn-asym": _quantized(method="rtn_asym", head="int8"),
    "kquant": _quantized(method="k_quant", head="int8"),
    "kquant-l0": _quantized(method="k_quant", head="int8", accuracy_level=0),
    "minmax": _quantized(method="minmax_offset", head="int8"),
    "gguf": _gguf(accuracy_level=4),
    "gguf-head-fp32": _gguf(accuracy_level=4, head="fp32"),
    "gguf-head-l0": _gguf(accuracy_level=4, head_accuracy_level=0),
    "gguf-l0": _gguf(accuracy_level=0),
    "gguf-rescore": _gguf(accuracy_level=4, rescore_top_k=TOP_K),
    "gguf-int4head-rescore": _gguf(accuracy_level=4, head="int4", rescore_top_k=TOP_K),
    **{
        f"gguf-int4head-rescore-{o}": _gguf(head="int4", rescore_top_k=TOP_K, offsets=o)
        for o in ("centered", "digits2", "digits3", "int8")
    },
}


def build_fp32(name: str) -> tuple[onnx.ModelProto, str, list[str] | None]:
    """(the fp32 model, its GGUF path or "", its token strings or None)."""
    from edgesplit.model import zoo

    if name == "smollm2":
        from edgesplit.model.gguf_decoder import load_gguf, smollm2_path

        path = str(smollm2_path())
        model, tokens = load_gguf(path, "smollm2")
        return model, path, tokens
    return zoo.build(name, 0), "", None


def main() -> None:
    from edgesplit.generate import Generator
    from edgesplit.model.gguf_decoder import smollm2_path
    from edgesplit.model.zoo_decoder import config_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2" if smollm2_path() else "decoder_100m")
    ap.add_argument("--variants", default="rtn,rtn-int4head,gguf,gguf-head-fp32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--chunk-tokens", type=int, default=32)
    ap.add_argument("--accuracy", action="store_true", help="also measure accuracy (SmolLM2)")
    ap.add_argument(
        "--rotary", choices=("ops", "fused", "both"), default="ops", help="see the module doc"
    )
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    logging.disable(logging.INFO)
    fp32, path, tokens = build_fp32(args.model)
    names = [v for v in args.variants.split(",") if v and (path or not v.startswith("gguf"))]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}: {sorted(VARIANTS)}")
    models = {"fp32": fp32, **{v: VARIANTS[v](fp32, path) for v in names}}
    if args.rotary != "ops":
        from edgesplit.model.decoder_fusion import fuse_rotary

        fused = {f"{k}+rotary": fuse_rotary(m)[0] for k, m in models.items()}
        models = {**models, **fused} if args.rotary == "both" else fused
    config = config_of(fp32)
    prompt = np.random.default_rng(0).integers(0, config.vocab_size, args.prompt_tokens)
    gens = {k: Generator(m, chunk_tokens=args.chunk_tokens) for k, m in models.items()}
    rates: dict[str, list[float]] = {k: [] for k in gens}
    ttft: dict[str, list[float]] = {k: [] for k in gens}
    for gen in gens.values():  # warm-up
        list(gen.generate(prompt, 4))
    for _ in range(args.rounds):
        for name, gen in gens.items():
            list(gen.generate(prompt, args.new_tokens))
            rates[name].append(gen.last_stats.decode_tokens_per_s)
            ttft[name].append(gen.last_stats.ttft_ms)

    def base(k: str) -> float:  # each model against fp32 with its own rotary form
        return statistics.median(rates["fp32+rotary" if k.endswith("+rotary") else "fp32"])

    rows = {
        k: {
            "decode_tokens_per_s": round(statistics.median(rates[k]), 2),
            "decode_vs_fp32": round(statistics.median(rates[k]) / base(k), 3),
            "ttft_ms": round(statistics.median(ttft[k]), 1),
            "rounds_tokens_per_s": [round(r, 2) for r in rates[k]],
        }
        for k in gens
    }
    if args.accuracy and tokens is not None:
        from edgesplit.generate.accuracy import HELD_OUT_PROMPTS, decoder_accuracy
        from edgesplit.generate.text import encode

        prompts = [encode(t, tokens) for t in HELD_OUT_PROMPTS]
        for k in [k for k in models if not k.startswith("fp32")]:
            acc = decoder_accuracy(fp32, models[k], prompts)
            rows[k]["snr_db"] = round(acc.snr_db, 1)
            rows[k]["top1_agreement"] = round(acc.top1_agreement or 0.0, 4)
            rows[k]["positions"] = acc.samples
    print(f"{args.model}: {config.parameters / 1e6:.0f}M parameters, prompt {args.prompt_tokens}, "
          f"{args.new_tokens} new tokens, chunk {args.chunk_tokens}, {args.rounds} rounds "
          f"alternating, rotary {args.rotary}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print(f"{'variant':<24}{'decode tok/s':>13}{'x fp32':>8}{'TTFT ms':>9}{'SNR dB':>8}"
          f"{'top-1':>8}   per round")  # fmt: skip
    for k, r in rows.items():
        snr = f"{r['snr_db']:>8.1f}" if "snr_db" in r else f"{'':>8}"
        top1 = f"{r['top1_agreement']:>8.3f}" if "top1_agreement" in r else f"{'':>8}"
        print(f"{k:<24}{r['decode_tokens_per_s']:>13.1f}{r['decode_vs_fp32']:>8.2f}"
              f"{r['ttft_ms']:>9.1f}{snr}{top1}   {r['rounds_tokens_per_s']}")  # fmt: skip
    print("baseline: fp32, same runtime and threads")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "rotary": args.rotary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
