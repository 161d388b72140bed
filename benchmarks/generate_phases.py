"""Plans per phase on host-biglittle: the chosen phase plan against each single processor,
measured vs predicted, in alternating rounds.

    PYTHONPATH=. python benchmarks/generate_phases.py [--models decoder_small,decoder_100m]

For each model: measure the phase profile (edgesplit.generate.phase_measure), choose the plan
(edgesplit.generate.phases), then run the chosen plan and each processor's best single-processor
plan (its best chunk) with the real Generator on configured worker threads, one round of every
plan after another. Prints predicted and measured (median over rounds) TTFT, decode and total,
and whether the chosen plan beat the best single processor as measured.
"""

from __future__ import annotations

import argparse
import statistics

from edgesplit.device.spec import load_device
from edgesplit.generate.phase_measure import (
    MeasureOptions,
    measure_phases,
    open_runner,
    phase_processors,
    random_prompt,
    run_phases,
)
from edgesplit.generate.phases import choose_phases
from edgesplit.model import zoo_decoder


def bench(name: str, prompt_tokens: int, new_tokens: int, rounds: int, repeats: int) -> None:
    model = getattr(zoo_decoder, name)()
    spec = load_device("host-biglittle")
    profile = measure_phases(
        model, spec, (prompt_tokens, new_tokens), MeasureOptions(repeats=repeats)
    )
    plan = choose_phases(profile)
    singles = {}
    for c in plan.candidates:
        if c.single_processor and c.prefill_processor not in singles:
            singles[c.prefill_processor] = c
    plans = {"chosen: " + plan.chosen.label: plan.chosen}
    plans.update({"single " + c.label: c for c in singles.values()})
    runners = {p.name: open_runner(p, model) for p in phase_processors(spec)}
    prompt = random_prompt(zoo_decoder.config_of(model).vocab_size, prompt_tokens, 1)
    runs: dict[str, list] = {k: [] for k in plans}
    try:
        for _ in range(rounds):
            for key, c in plans.items():
                pre, dec = runners[c.prefill_processor], runners[c.decode_processor]
                gen_pre = pre.generator(model, c.chunk_tokens)
                gen_dec = dec.generator(model, c.chunk_tokens)
                runs[key].append(run_phases((pre, gen_pre), (dec, gen_dec), prompt, new_tokens))
    finally:
        for r in runners.values():
            r.close()
    print(f"\n{name} on host-biglittle, P={prompt_tokens}, N={new_tokens}, {rounds} rounds")
    print(
        "| plan | pred TTFT ms | meas TTFT ms | pred decode ms | meas decode ms | "
        "pred total ms | meas total ms | meas/pred | meas wall ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    measured = {}
    for key, c in plans.items():
        med = {
            f: statistics.median(getattr(r, f) for r in runs[key])
            for f in ("ttft_ms", "decode_ms", "total_ms", "wall_ms", "switch_ms")
        }
        measured[key] = med["total_ms"]
        print(
            f"| {key} | {c.ttft_ms:.2f} | {med['ttft_ms']:.2f} | {c.decode_ms + c.switch_ms:.2f} "
            f"| {med['decode_ms'] + med['switch_ms']:.2f} | {c.total_ms:.2f} "
            f"| {med['total_ms']:.2f} "
            f"| {med['total_ms'] / c.total_ms:.2f} | {med['wall_ms']:.2f} |"
        )
    chosen_key = next(iter(plans))
    best_single = min((k for k in plans if k.startswith("single")), key=measured.get)
    two_phase = not plan.chosen.single_processor
    if not two_phase:
        print(
            f"chosen plan is single-processor ({plan.chosen.label}): no two-phase plan was "
            f"predicted to win; measured best single: {best_single} {measured[best_single]:.2f} ms"
        )
        return
    verdict = "beats" if measured[chosen_key] < measured[best_single] else "does not beat"
    print(
        f"two-phase plan measured: it {verdict} the best single processor ({best_single}): "
        f"{measured[chosen_key]:.2f} vs {measured[best_single]:.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="decoder_small:64:32,decoder_100m:32:16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    for spec in a.models.split(","):
        name, p, n = spec.split(":")
        bench(name, int(p), int(n), a.rounds, a.repeats)


if __name__ == "__main__":
    main()
