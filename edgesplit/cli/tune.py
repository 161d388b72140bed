"""``edgesplit tune``: tune a model's TVM kernels ahead of time, into a database for the target."""

from __future__ import annotations

from pathlib import Path

import click

from edgesplit.backends.tvm.tune import TuneOptions
from edgesplit.cli.common import (
    console,
    device_option,
    input_shape_option,
    model_argument,
    progress_bar,
)
from edgesplit.cli.options import (
    RemoteFlags,
    Verbosity,
    field_option,
    option_group,
    remote_options,
    verbosity_options,
)

search_options = option_group(
    TuneOptions,
    "search",
    field_option(
        "--trials-per-task",
        type=click.IntRange(1),
        help="Measured candidates per kernel; kernels a database already holds this many of are "
        "skipped.",
    ),
    field_option("--max-trials", type=click.IntRange(1), help="Cap on the candidates of this run."),
    field_option(
        "-o",
        "--output",
        "database",
        type=click.Path(file_okay=False, path_type=Path),
        help="Database folder to write (e.g. profiles/tvm/NAME); default: the target's cache "
        "folder.",
    ),
    field_option(
        "--trials-per-iter",
        type=click.IntRange(1, 64),
        help="Candidates per search round of a kernel (default: a quarter of --trials-per-task). "
        "With --max-trials below kernels x --trials-per-task, later rounds go to the kernels that "
        "gain most.",
    ),
    field_option(
        "--population",
        type=click.IntRange(2, 4096),
        help="Candidates the evolutionary search keeps per round of a kernel (default: 16 per "
        "candidate measured in a round, 32 to 512). Smaller searches faster and finds less.",
    ),
    field_option(
        "--builders",
        "builder_workers",
        type=click.IntRange(1),
        help="Build processes (default: every core).",
    ),
)


@click.command("tune")
@model_argument
@device_option
@click.option(
    "--processor",
    "-p",
    default=None,
    help="The processor to tune for (default: the first with TVM).",
)
@search_options
@input_shape_option
@remote_options("Measure the candidates on this host over SSH.")
@verbosity_options
def command(
    model: str,
    device: str,
    processor: str | None,
    search: TuneOptions,
    input_shapes: tuple[str, ...],
    remote: RemoteFlags,
    verbosity: Verbosity,
) -> None:
    """Tune MODEL's kernels with MetaSchedule for one processor of DEVICE.

    Kernels are shared across models: a database already holding a kernel (from another model)
    is not tuned again. Compile, profile and the benchmarks apply the database afterwards.
    """
    from edgesplit.backends.tvm.tune import tune_model
    from edgesplit.model.load import parse_input_shapes

    with progress_bar(not verbosity.quiet) as update:
        report = tune_model(
            model,
            device,
            processor,
            options=search,
            input_shapes=parse_input_shapes(input_shapes) or None,
            remote=remote.remote,
            ssh=remote.ssh() if remote.remote else None,
            progress=update,
        )
    console.print(
        f"{report.tasks} kernels: {report.tuned} tuned ({report.trials} trials, "
        f"{report.trials_per_task} per kernel at most), {report.reused} already in a database; "
        f"{report.elapsed_s:.0f} s"
    )
    if report.rpc_sessions is not None:
        console.print(
            f"measured on {report.measured_on} ({report.rpc_sessions} RPC sessions there)"
        )
    console.print(f"target {report.target}")
    console.print(f"wrote {report.database}")
