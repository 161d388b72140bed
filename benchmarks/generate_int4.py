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

``--fuse`` (comma-separated, from :data:`FUSIONS`) runs every model, fp32 included, once more for
each fusion of :mod:`edgesplit.model.decoder_fusion` and
:mod:`edgesplit.model.attention_fusion` named, as ``NAME+FUSION``:

- ``rotary``: rotary embeddings as ORT's ``RotaryEmbedding`` (``fuse_rotary``);
- ``attention``: each layer's attention as one ``GroupQueryAttention`` (``fuse_attention``);
- ``attention+norm``: that, and each residual ``Add`` with the RMSNorm after it as one
  ``SkipSimplifiedLayerNormalization`` (``fuse_skip_norm``).

Each model is compared with fp32 in the same form (``x fp32``: the ratio of the medians;
``paired``: the median of each round's ratio, which follows load that drifts between rounds) and
with plain fp32 (``x plain``).
``--no-plain`` leaves out the unfused models; ``--rotary fused`` is ``--fuse rotary --no-plain``
and ``--rotary both`` is ``--fuse rotary``.

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


def _fusions(*names: str) -> Callable[[onnx.ModelProto], onnx.ModelProto]:
    def fuse(model: onnx.ModelProto) -> onnx.ModelProto:
        from edgesplit.model import attention_fusion, decoder_fusion

        for name in names:
            module = attention_fusion if hasattr(attention_fusion, name) else decoder_fusion
            model = getattr(module, name)(model)[0]
        return model

    return fuse


FUSIONS = {
    "rotary": _fusions("fuse_rotary"),
    "attention": _fusions("fuse_attention"),
    "attention+norm": _fusions("fuse_attention", "fuse_skip_norm"),
}
"""``--fuse`` choices: the transforms applied to every model, in order."""

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
    ap.add_argument("--fuse", default="", help=f"comma-separated, of {sorted(FUSIONS)}")
    ap.add_argument("--no-plain", action="store_true", help="only the fused models")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    logging.disable(logging.INFO)
    fp32, path, tokens = build_fp32(args.model)
    names = [v for v in args.variants.split(",") if v and (path or not v.startswith("gguf"))]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}: {sorted(VARIANTS)}")
    fusions = [f for f in args.fuse.split(",") if f] + (["rotary"] if args.rotary != "ops" else [])
    if any(f not in FUSIONS for f in fusions):
        ap.error(f"unknown fusions in {fusions}: {sorted(FUSIONS)}")
    plain = {"fp32": fp32, **{v: VARIANTS[v](fp32, path) for v in names}}
    models = {} if args.no_plain or args.rotary == "fused" else dict(plain)
    for f in fusions:
        models.update({f"{k}+{f}": FUSIONS[f](m) for k, m in plain.items()})
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

    def base_name(k: str) -> str:  # fp32 in the same form as model k
        return "fp32" + k[len(k.split("+")[0]) :]

    def base(k: str) -> float:
        return statistics.median(rates[base_name(k)])

    def paired(k: str) -> float:  # the median of each round's ratio, the rounds side by side
        return statistics.median(r / b for r, b in zip(rates[k], rates[base_name(k)], strict=True))

    def vs_plain(k: str) -> float | None:
        return (
            statistics.median(rates[k]) / statistics.median(rates["fp32"])
            if "fp32" in rates
            else None
        )

    rows = {
        k: {
            "decode_tokens_per_s": round(statistics.median(rates[k]), 2),
            "decode_vs_fp32": round(statistics.median(rates[k]) / base(k), 3),
            "decode_vs_fp32_paired": round(paired(k), 3),
            "decode_vs_fp32_plain": round(vs_plain(k) or 0.0, 3),
            "ttft_ms": round(statistics.median(ttft[k]), 1),
            "rounds_tokens_per_s": [round(r, 2) for r in rates[k]],
        }
        for k in gens
    }
    if args.accuracy and tokens is not None:
        from edgesplit.generate.accuracy import HELD_OUT_PROMPTS, decoder_accuracy
        from edgesplit.generate.text import encode

        prompts = [encode(t, tokens) for t in HELD_OUT_PROMPTS]
        for k in [k for k in models if k != "fp32"]:
            acc = decoder_accuracy(fp32, models[k], prompts)
            rows[k]["snr_db"] = round(acc.snr_db, 1)
            rows[k]["top1_agreement"] = round(acc.top1_agreement or 0.0, 4)
            rows[k]["positions"] = acc.samples
    print(f"{args.model}: {config.parameters / 1e6:.0f}M parameters, prompt {args.prompt_tokens}, "
          f"{args.new_tokens} new tokens, chunk {args.chunk_tokens}, {args.rounds} rounds "
          f"alternating, fusions {fusions or 'none'}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print(f"{'variant':<46}{'decode tok/s':>13}{'x fp32':>8}{'paired':>8}{'x plain':>8}"
          f"{'TTFT ms':>9}{'SNR dB':>8}{'top-1':>8}   per round")  # fmt: skip
    for k, r in rows.items():
        snr = f"{r['snr_db']:>8.1f}" if "snr_db" in r else f"{'':>8}"
        top1 = f"{r['top1_agreement']:>8.3f}" if "top1_agreement" in r else f"{'':>8}"
        print(f"{k:<46}{r['decode_tokens_per_s']:>13.1f}{r['decode_vs_fp32']:>8.2f}"
              f"{r['decode_vs_fp32_paired']:>8.2f}{r['decode_vs_fp32_plain']:>8.2f}"
              f"{r['ttft_ms']:>9.1f}{snr}{top1}   "
              f"{r['rounds_tokens_per_s']}")  # fmt: skip
    print("baseline: fp32, same runtime and threads (x fp32: in the same form; x plain: unfused)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "fusions": fusions, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
