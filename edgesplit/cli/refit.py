"""``edgesplit refit``: run bundles, refit their profile's cost terms, write the profile."""

from __future__ import annotations

import dataclasses

import click

from edgesplit.cli.common import FiniteFloat, console, file_option, trust_key_option
from edgesplit.cli.options import (
    Verbosity,
    field_option,
    option_group,
    verbosity_options,
    warmup_option,
)
from edgesplit.workflows.refit_rounds import RefitRounds

rounds_options = option_group(
    RefitRounds,
    "rounds",
    field_option("--runs", type=click.IntRange(3), help="Timed runs per round."),
    warmup_option,
    field_option(
        "--rounds", "max_rounds", type=click.IntRange(1), help="At most this many rounds."
    ),
    field_option(
        "--tolerance",
        type=FiniteFloat(minimum=0, open_min=True),
        help="Converged when a round's runs are predicted within this relative error.",
    ),
)
"""``--runs``, ``--warmup``, ``--rounds`` and ``--tolerance``: how long refitting goes on."""


@click.command("refit")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(file_okay=False))
@file_option(
    "-o",
    "--output",
    required=True,
    help="Where to write the refitted profile.",
)
@file_option(
    "--profile",
    "profile_path",
    help="The profile to refit (default: the one the first bundle's plan was made from).",
)
@rounds_options
@click.option(
    "--server",
    "server_url",
    default=None,
    help="A server (edgesplit serve URL) that serves the bundles' server parts: their calls there "
    "fit the cost of a call beyond the link and the compute.",
)
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="NAME=FILE.npy",
    help="A value to run the bundles with (repeatable; default: made up within the bounds of "
    "the ops that read it).",
)
@trust_key_option
@verbosity_options
def command(
    bundles: tuple[str, ...],
    output: str,
    profile_path: str | None,
    rounds: RefitRounds,
    server_url: str | None,
    inputs: tuple[str, ...],
    trust_key: str | None,
    verbosity: Verbosity,
) -> None:
    """Run BUNDLES, fit the cost terms of their profile to the measured part runs, and write them.

    BUNDLES are of one model on one device: a plan and its baselines (the whole model on each
    processor) together pin more terms than one plan alone. Each round runs every bundle (in an
    order rotated each round), predicts each one's latency with the terms fitted so far, then fits
    the terms again on every round's runs of every bundle. Plan with the result:
    ``partition --profile OUTPUT``.
    """
    from edgesplit.model.load import parse_input_values
    from edgesplit.workflows.refit import refit

    result = refit(
        list(bundles),
        profile=profile_path,
        **dataclasses.asdict(rounds),
        progress=None if verbosity.quiet else console.print,
        trust_key=trust_key,
        server_url=server_url,
        inputs=parse_input_values(inputs) or None,
    )
    result.profile.save(output)
    if not verbosity.quiet:
        print_result(result)
    console.print(f"profile: {output}")


def print_result(result) -> None:
    from rich.table import Table

    table = Table(title="rounds (predicted with the terms fitted before the round)")
    for col in ("round", "bundle", "figure", "predicted ms", "measured ms", "error"):
        table.add_column(col, justify="right")
    for r in result.rounds:
        for c in r.cases:
            table.add_row(
                str(r.number),
                c.bundle,
                c.metric,
                f"{c.predicted_ms:.3f}",
                f"{c.measured_ms:.3f}",
                f"{c.error:+.1%}",
            )
    console.print(table)
    fits = Table(
        title="fitted terms (last round; contention from the streams goes into the profile too)"
    )
    for col in ("processor/backend", "parts", "node scale", "fixed ms per part", "ms per crossing"):
        fits.add_column(col, justify="right")
    for f in result.rounds[-1].fits:
        fits.add_row(
            f"{f.processor}/{f.backend}",
            str(f.parts),
            f"{f.node_scale:.3f}",
            f"{f.part_fixed_ms:.3f}",
            f"{f.crossing_ms:.3f}",
        )
    console.print(fits)
    _print_fitted(result)
    _print_convergence(result)


def _print_fitted(result) -> None:
    """What was fitted beyond the per-part terms: contention, stream gaps, remote calls."""
    seen = set()
    for e in result.profile.entries:
        t = e.terms
        if t is None or not t.calibrated or e.processor in seen:
            continue
        seen.add(e.processor)
        was = t.calibrated_from.get("contention", {})
        for other, factor in t.contention.items():
            if factor != was.get(other):
                console.print(
                    f"contention fitted from the streams: {e.processor} runs {factor:.3f}x slower "
                    "while "
                    f"{other} is busy (profiled {was.get(other, 1.0):.3f}x)"
                )
        if t.stream_gap_ms is not None:
            hand_off = (
                f"; the profiled hand-off at zero idle gap {t.handoff_ms[0]:.3f} ms"
                if t.handoff_ms
                else ""
            )
            console.print(
                f"a busy worker's gap before a queued part, from the streams: {e.processor} "
                f"{t.stream_gap_ms:.3f} ms{hand_off}"
            )
    terms = [e.terms for e in result.profile.entries if e.terms is not None]
    t = next((t for t in terms if t.remote_call_ms or t.remote_call_ms_per_mb), None)
    if t is not None:
        console.print(
            f"a call to the server beyond the link and its compute: {t.remote_call_ms:.3f} ms per "
            "call "
            f"+ {t.remote_call_ms_per_mb:.3f} ms per MB sent or received"
        )


def _print_convergence(result) -> None:
    """Whether the rounds converged, and the latency the profile predicts now."""
    if result.converged_after is not None:
        console.print(
            f"converged after {result.converged_after} round(s) of fitting: within "
            f"{result.tolerance:.0%}"
        )
    elif len(result.rounds) == 1:  # the fitted terms predict no round yet: say how the profile did
        worst = max(result.rounds[0].cases, key=lambda c: abs(c.error))
        within = "within" if abs(worst.error) <= result.tolerance else "not within"
        console.print(
            f"the profile as measured was {within} {result.tolerance:.0%} on round 1 "
            f"(worst {worst.error:+.1%}, {worst.bundle} {worst.metric}); "
            "one round cannot check the fitted terms (--rounds 2 does)"
        )
    else:
        console.print(f"not within {result.tolerance:.0%} after {len(result.rounds)} round(s)")
    now = ", ".join(f"{b} {ms:.3f} ms" for b, ms in result.predicted_ms.items())
    console.print(f"latency predicted now: {now}")
