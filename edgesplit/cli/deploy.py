"""``edgesplit deploy``: profile, partition and compile in one step."""

from __future__ import annotations

import click

from edgesplit.cli.common import (
    accuracy_choices,
    accuracy_options,
    backend_option,
    console,
    device_option,
    force_option,
    input_shape_option,
    input_values_option,
    link_options,
    load_graph,
    model_inputs,
    objective_option,
    pin_option,
    progress_bar,
    runs_option,
    sign_key_option,
    slo_option,
    split_option,
    stage_limit_options,
)
from edgesplit.cli.compile import tune_options, tune_per_task_option, verify_options


@click.command("deploy")
@click.argument("model", type=click.Path(dir_okay=False))
@device_option
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False),
    help="Bundle directory (an existing one must be empty or a bundle, unless --force).",
)
@force_option
@sign_key_option
@objective_option
@split_option
@slo_option
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False),
    help="Use this profile instead of measuring.",
)
@link_options
@pin_option
@accuracy_options
@input_shape_option
@input_values_option
@stage_limit_options
@runs_option
@backend_option
@click.option(
    "--no-bands",
    is_flag=True,
    help="With a server: do not add a plan per bandwidth band (the bundle runs the one plan).",
)
@click.option("--tune-trials", default=0, show_default=True, help="MetaSchedule trials for TVM parts.")
@click.option(
    "--no-verify",
    is_flag=True,
    help="Ship the plan without measuring it against the best baselines on this device.",
)
@verify_options
@tune_per_task_option
def command(
    model,
    device,
    output,
    force,
    sign_key,
    objective,
    split_operators,
    slo_ms,
    profile_path,
    server,
    server_profile,
    link,
    bandwidth_mbps,
    rtt_ms,
    pins,
    min_snr_db,
    min_top1_agreement,
    max_accuracy_drop,
    calibration_data,
    calibration_method,
    input_shapes,
    input_values,
    runs,
    backends,
    tune_trials,
    no_bands,
    no_verify,
    verify_budget_s,
    server_url,
    token,
    tune_trials_per_task,
):
    """Profile MODEL on DEVICE, partition it and compile a bundle."""
    from edgesplit.compile.build import check_output
    from edgesplit.profile.run import ProfileOptions
    from edgesplit.workflows.deploy import deploy, profile_beside
    from edgesplit.workflows.resolve import Choices, check_choices, load_spec

    choices = dict(
        objective=objective,
        split_operators=split_operators,
        slo_ms=slo_ms,
        profile=profile_path,
        server=server,
        server_profile=server_profile,
        link=link,
        bandwidth_mbps=bandwidth_mbps,
        rtt_ms=rtt_ms,
        pins=pins,
        profiling=ProfileOptions(backends, runs=runs),
        **model_inputs(input_shapes, input_values),
        **accuracy_choices(
            min_snr_db, min_top1_agreement, max_accuracy_drop, calibration_data, calibration_method
        ),
    )
    check_choices(Choices(**choices))  # bad flags fail before the model is read
    check_output(output, force, [model])  # and so does an output that may not be replaced
    device = load_spec(device)  # and a bad device spec (reading a model can take seconds)
    graph = load_graph(model, choices["input_shapes"], choices["input_values"])  # prints its notes
    with progress_bar() as update:
        manifest = deploy(
            graph,
            device,
            output,
            tune_trials=tune_trials,
            tune=tune_options(tune_trials, tune_trials_per_task),
            progress=update,
            force=force,
            sign_key=sign_key,
            bands=not no_bands,
            verify=not no_verify,
            verify_budget_s=verify_budget_s,
            server_url=server_url,
            token=token,
            **choices,
        )
    _report(manifest, no_verify)
    kept = f" and its profile {profile_beside(output)}" if profile_path is None else ""
    console.print(f"wrote {output}" + (" (signed)" if sign_key else "") + kept)


def _report(manifest, no_verify: bool) -> None:
    """The bundle, the plan's predicted figures and the verification table."""
    from edgesplit.cli.compile import print_manifest, print_verification
    from edgesplit.cli.partition import cost_sources_line

    print_manifest(manifest)
    lat, mj = manifest.plan.predicted.latency_ms, manifest.plan.predicted.energy_mj
    if lat is not None or mj is not None:
        nan = float("nan")
        console.print(
            f"predicted: {nan if lat is None else lat:.3f} ms, "
            f"{nan if mj is None else mj:.3f} mJ per inference"
        )
    costs = cost_sources_line(manifest.plan)
    if costs:
        console.print(costs, soft_wrap=True)
    if manifest.verification is not None:
        print_verification(manifest.verification)
    elif no_verify:
        console.print("not verified (--no-verify): the plan was not measured against the baselines")
