"""``edgesplit compile``: a model and its plan -> a bundle of per-device artifacts."""

from __future__ import annotations

import click

from edgesplit.cli.common import (
    console,
    force_option,
    input_shape_option,
    input_values_option,
    model_inputs,
    sign_key_option,
)


@click.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--plan", "plan_path", required=True, type=click.Path(dir_okay=False), help="plan.json from partition."
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False),
    help="Bundle directory to write (an existing one must be empty or a bundle, unless --force).",
)
@force_option
@sign_key_option
@click.option(
    "--device",
    "-d",
    default=None,
    metavar="NAME|FILE.yaml",
    help="Device spec (default: the spec file the plan was made with, else its name).",
)
@input_shape_option
@input_values_option
@click.option(
    "--tune-trials",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="MetaSchedule trials for TVM parts (0: untuned, or the cached database).",
)
@click.option(
    "--no-bands",
    is_flag=True,
    help="With a server: do not add a plan per bandwidth band (the bundle runs the one plan).",
)
def command(
    model, plan_path, output, force, sign_key, device, input_shapes, input_values, tune_trials, no_bands
):
    """Extract, check and compile every part of PLAN for MODEL into a bundle."""
    from edgesplit.compile.api import compile_bundle

    manifest = compile_bundle(
        model,
        plan_path,
        output,
        device=device,
        **model_inputs(input_shapes, input_values),
        tune_trials=tune_trials,
        force=force,
        sign_key=sign_key,
        bands=not no_bands,
    )
    print_manifest(manifest)
    console.print(f"wrote {output}" + (" (signed)" if sign_key else ""))


def print_manifest(manifest) -> None:
    from rich.table import Table

    t = Table(title=f"bundle of {manifest.model_name} for {manifest.device}")
    for col in ("part", "processor", "backend", "file", "inputs", "outputs", "predicted ms", "note"):
        t.add_column(col)
    for p in manifest.parts:
        t.add_row(
            p.name,
            p.processor + (" (remote)" if p.remote else ""),
            p.backend,
            p.file,
            str(len(p.inputs)),
            str(len(p.outputs)),
            f"{p.predicted_ms:.3f}" if p.predicted_ms is not None else "-",
            p.note[:50],
        )
    console.print(t)
    for n in manifest.notes:
        console.print(f"note: {n}")
    if manifest.bands is not None:
        print_bands(manifest.bands)


def print_bands(bands) -> None:
    """The band table: which plan runs at which uplink rate."""
    from rich.table import Table

    t = Table(title=f"band table ({bands.objective}): the plan for each uplink rate")
    for col in ("Mbit/s from", "to", "plan", "parts", "value at ends"):
        t.add_column(col)
    for b in bands.bands:
        plan = bands.plans[b["plan"]]
        where = " ".join(f"{p.processor}:{len(p.nodes)}" for p in plan.plan.parts)
        t.add_row(
            f"{b['lo_mbps']:.4g}",
            f"{b['hi_mbps']:.4g}",
            str(b["plan"]),
            where[:60],
            f"{b['value_lo']:.3f} .. {b['value_hi']:.3f}",
        )
    console.print(t)
