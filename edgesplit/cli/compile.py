"""``edgesplit compile``: a model and its plan -> a bundle of per-device artifacts."""

from __future__ import annotations

import click

from edgesplit.cli.common import (
    console,
    force_option,
    input_shape_option,
    input_values_option,
    model_inputs,
    progress_bar,
    sign_key_option,
    stage_limit_options,
)

tune_per_task_option = click.option(
    "--tune-trials-per-task",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="Tune each kernel of the TVM parts with up to N trials (kernels a database holds N of are "
    "skipped); --tune-trials caps the total.",
)


def tune_options(total: int, per_task: int):
    """The tuning asked for by --tune-trials / --tune-trials-per-task (None: per-task not given)."""
    from edgesplit.backends.tvm.tune import TuneOptions

    if not per_task:
        return None
    return TuneOptions(trials_per_task=per_task, max_trials=total or None)


def verify_options(f):
    """``--verify-budget-s``, ``--server-url`` and ``--token`` (deploy and compile --verify)."""
    f = click.option(
        "--token", default=None, envvar="EDGESPLIT_TOKEN", help="Bearer token for the offload server."
    )(f)
    f = click.option(
        "--server-url",
        default=None,
        metavar="URL|local",
        help="Offload server for candidates with server parts while verifying (local: serve them "
        "from this process); without one they are skipped.",
    )(f)
    return click.option(
        "--verify-budget-s",
        default=30.0,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="The most time verification may spend measuring.",
    )(f)


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
@stage_limit_options
@click.option(
    "--tune-trials",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="MetaSchedule trials for TVM parts in all (0: none; the tuning databases still apply).",
)
@click.option(
    "--no-bands",
    is_flag=True,
    help="With a server: do not add a plan per bandwidth band (the bundle runs the one plan).",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Measure the plan against the best baselines here; ship the measured winner.",
)
@verify_options
@tune_per_task_option
def command(
    model,
    plan_path,
    output,
    force,
    sign_key,
    device,
    input_shapes,
    input_values,
    tune_trials,
    no_bands,
    verify,
    verify_budget_s,
    server_url,
    token,
    tune_trials_per_task,
):
    """Extract, check and compile every part of PLAN for MODEL into a bundle."""
    inputs = model_inputs(input_shapes, input_values)
    tune = tune_options(tune_trials, tune_trials_per_task)
    if verify:
        from edgesplit.workflows.deploy import verify_options_for

        options = verify_options_for(verify_budget_s, server_url, token)
        manifest = _verified(
            model,
            plan_path,
            output,
            device,
            inputs,
            tune_trials,
            tune,
            options,
            force,
            sign_key,
            not no_bands,
        )
    else:
        from edgesplit.workflows.compile import compile_bundle

        with progress_bar(bool(tune_trials or tune_trials_per_task)) as update:
            manifest = compile_bundle(
                model,
                plan_path,
                output,
                device=device,
                **inputs,
                tune_trials=tune_trials,
                tune=tune,
                progress=update,
                force=force,
                sign_key=sign_key,
                bands=not no_bands,
            )
    print_manifest(manifest)
    if manifest.verification is not None:
        print_verification(manifest.verification)
    console.print(f"wrote {output}" + (" (signed)" if sign_key else ""))


def _verified(model, plan_path, output, device, inputs, tune_trials, tune, options, force, sign_key, bands):
    """The plan's problem loaded again from what it records, then verified (as ``deploy`` does)."""
    from dataclasses import replace

    from edgesplit.cli.common import progress_bar
    from edgesplit.compile.build import check_output
    from edgesplit.workflows.resolve import as_plan, load_graph, load_spec, problem_from_plan
    from edgesplit.workflows.verify import verify_plan

    check_output(output, force, [model, plan_path])  # before the slow steps
    plan = as_plan(plan_path)
    graph = load_graph(model, inputs["input_shapes"] or plan.input_shapes or None, inputs["input_values"])
    problem = problem_from_plan(plan, graph)
    if device is not None:
        problem = replace(problem, device=load_spec(device))
    with progress_bar() as update:
        return verify_plan(
            problem,
            plan,
            output,
            options=options,
            tune_trials=tune_trials,
            tune=tune,
            progress=update,
            force=force,
            sign_key=sign_key,
            bands=bands,
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
        title=f"verification on this device: {v.metric}, {v.rounds} rounds x {v.requests_per_turn} ({unit})"
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
            note = ", ".join(x for x in (note, f"misses the accuracy budget: {c.accuracy_misses}") if x)
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
