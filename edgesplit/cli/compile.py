"""``edgesplit compile``: a model and its plan -> a bundle of per-device artifacts."""

from __future__ import annotations

import click

from edgesplit.cli.common import (
    console,
    file_option,
    model_argument,
    progress_bar,
    stage_limit_options,
)
from edgesplit.cli.options import (
    BuildOptions,
    BundleOutput,
    ModelInputs,
    Verbosity,
    build_options,
    bundle_output_options,
    model_input_options,
    verbosity_options,
)


@click.command("compile")
@model_argument
@file_option(
    "--plan",
    "plan_path",
    required=True,
    help="plan.json from partition.",
)
@bundle_output_options(
    "Bundle directory to write (an existing one must be empty or a bundle, unless --force)."
)
@click.option(
    "--device",
    "-d",
    default=None,
    metavar="NAME|FILE.yaml",
    help="Device spec (default: the spec file the plan was made with, else its name).",
)
@model_input_options
@stage_limit_options
@build_options(
    "MetaSchedule trials for TVM parts in all (0: none; the tuning databases still apply).",
    click.option(
        "--verify",
        is_flag=True,
        help="Measure the plan against the best baselines here; ship the measured winner.",
    ),
)
@verbosity_options
def command(
    model: str,
    plan_path: str,
    bundle: BundleOutput,
    device: str | None,
    inputs: ModelInputs,
    build: BuildOptions,
    verify: bool,
    verbosity: Verbosity,
) -> None:
    """Extract, check and compile every part of PLAN for MODEL into a bundle."""
    from edgesplit.workflows.bundle_files import compile_plan

    request = bundle_request(bundle, build, verify)
    bar = verify or bool(build.tune_trials or build.tune_trials_per_task)
    with progress_bar(bar and not verbosity.quiet) as update:
        manifest = compile_plan(
            model, plan_path, request, device=device, **inputs.parsed(), progress=update
        )
    if not verbosity.quiet:
        print_manifest(manifest)
        if manifest.verification is not None:
            print_verification(manifest.verification)
    console.print(f"wrote {bundle.output}" + (" (signed)" if bundle.sign_key else ""))


def bundle_request(bundle: BundleOutput, build: BuildOptions, verify: bool):
    """The :class:`~edgesplit.workflows.bundle_files.BundleRequest` of the bundle options."""
    from edgesplit.workflows.bundle_files import BundleRequest

    return BundleRequest(
        out=bundle.output,
        force=bundle.force,
        sign_key=bundle.sign_key,
        tune_trials=build.tune_trials,
        tune=build.tune(),
        bands=not build.no_bands,
        verify=build.verify_options() if verify else None,
    )


def print_manifest(manifest) -> None:
    from rich.table import Table

    t = Table(title=f"bundle of {manifest.model_name} for {manifest.device}")
    for col in (
        "part",
        "processor",
        "backend",
        "precision",
        "file",
        "inputs",
        "outputs",
        "predicted ms",
        "note",
    ):
        t.add_column(col)
    for p in manifest.parts:
        t.add_row(
            p.name,
            p.processor + (" (remote)" if p.remote else ""),
            p.backend,
            p.precision,
            p.file,
            str(len(p.inputs)),
            str(len(p.outputs)),
            f"{p.predicted_ms:.3f}" if p.predicted_ms is not None else "-",
            p.note[:50],
        )
    console.print(t)
    for n in manifest.notes:
        console.print(f"note: {n}")
    from edgesplit.cli.partition import accuracy_lines

    for line in accuracy_lines(manifest.plan):  # the plan's int8/fp16 parts measured against fp32
        console.print(line, soft_wrap=True)
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


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _snr_cell(c) -> str:
    if c.snr_db is None:
        return "exact" if c.error is None and c.n_parts else "-"
    top1 = f", top-1 {c.top1_agreement:.0%}" if c.top1_agreement is not None else ""
    return f"{c.snr_db:.1f}{top1}"


def print_verification(v) -> None:
    """The verification table: every candidate, predicted and measured, and what was shipped."""
    from rich.table import Table

    unit = "ms per request (stream period)" if v.metric == "throughput" else "ms"
    t = Table(
        title=f"verification on this device: {v.metric}, {v.rounds} rounds x {v.requests_per_turn} "
        f"({unit})"
    )
    cols = ["candidate", "parts", "predicted ms", "measured median ms", "spread", "ratio to best"]
    cols += ["energy mJ (modelled)"] if v.metric == "energy" else []
    accuracy = any(c.snr_db is not None for c in v.candidates)
    cols += ["SNR dB vs fp32"] if accuracy else []
    for col in [*cols, "note"]:
        t.add_column(col)
    for c in v.candidates:
        note = "shipped" if c.name == v.shipped else ""
        if c.same_as:
            note = ", ".join(x for x in (note, f"same bundle as {c.same_as}") if x)
        if c.error:
            note = c.error
        row = [
            c.name,
            str(c.n_parts) if c.n_parts else "-",
            _fmt(c.predicted_ms, ".3f"),
            _fmt(c.measured_ms, ".3f"),
            "-" if c.spread_pct is None else f"{c.spread_pct:.1f}%",
            _fmt(c.ratio_to_best, ".3f"),
        ]
        row += [_fmt(c.energy_mj, ".3f")] if v.metric == "energy" else []
        row += [_snr_cell(c)] if accuracy else []
        if c.meets_budget is False:
            note = ", ".join(
                x for x in (note, f"misses the accuracy budget: {c.accuracy_misses}") if x
            )
        t.add_row(*row, note)
    console.print(t)
    for n in v.notes:
        console.print(f"note: {n}")
    if accuracy:
        console.print(
            f"accuracy budget: {v.accuracy_budget} (int8/fp16 candidates run on the held-out "
            f"calibration samples, {v.accuracy_s:.1f} s; all-fp32 ones are exact)"
        )
    console.print(
        f"shipped {v.shipped}: {v.reason}. Measuring took {v.measure_s:.1f} s of a "
        f"{v.budget_s:g} s budget (compiling the candidates {v.compile_s:.1f} s, loading them "
        f"{v.load_s:.1f} s)."
    )
