"""``edgesplit deploy``: profile, partition and compile in one step."""

from __future__ import annotations

import click

from edgesplit.cli.common import console, feedback
from edgesplit.cli.compile import bundle_request
from edgesplit.cli.options import (
    BuildOptions,
    BundleOutput,
    ModelInputs,
    PlanOptions,
    Verbosity,
    build_options,
    bundle_output_options,
    model_device_options,
    plan_options,
    verbosity_options,
)


@click.command("deploy")
@model_device_options
@bundle_output_options(
    "Bundle directory (an existing one must be empty or a bundle, unless --force)."
)
@plan_options("Use this profile instead of measuring.")
@build_options(
    "MetaSchedule trials for TVM parts.",
    click.option(
        "--no-verify",
        is_flag=True,
        help="Ship the plan without measuring it against the best baselines on this device.",
    ),
)
@verbosity_options
def command(
    model: str,
    device: str,
    bundle: BundleOutput,
    plan: PlanOptions,
    inputs: ModelInputs,
    build: BuildOptions,
    no_verify: bool,
    verbosity: Verbosity,
) -> None:
    """Profile MODEL on DEVICE, partition it and compile a bundle."""
    from edgesplit.workflows.bundle_files import deploy_model
    from edgesplit.workflows.deploy import profile_beside

    choices = plan.choices(inputs)
    request = bundle_request(bundle, build, not no_verify)
    with feedback(not verbosity.quiet) as told:
        manifest = deploy_model(model, device, choices, request, feedback=told)
    if not verbosity.quiet:
        _report(manifest, no_verify)
    kept = f" and its profile {profile_beside(bundle.output)}" if choices.profile is None else ""
    console.print(f"wrote {bundle.output}" + (" (signed)" if bundle.sign_key else "") + kept)


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
