"""``edgesplit tune``: tune a model's TVM kernels ahead of time, into a database for the target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from edgesplit.cli.common import console, device_option, input_shape_option, progress_bar
from edgesplit.cli.options import (
    RemoteFlags,
    Verbosity,
    option_group,
    remote_options,
    verbosity_options,
)

if TYPE_CHECKING:
    from edgesplit.backends.tvm.tune import TuneOptions


@dataclass(frozen=True)
class TuneSearch:
    """How many candidates are tried, how, and where the database goes."""

    trials_per_task: int = 64
    max_trials: int | None = None
    output: str | None = None
    trials_per_iter: int | None = None
    population: int | None = None
    builders: int | None = None

    def options(self) -> TuneOptions:
        """The search as :class:`edgesplit.backends.tvm.tune.TuneOptions`."""
        from pathlib import Path

        from edgesplit.backends.tvm.tune import TuneOptions

        return TuneOptions(
            trials_per_task=self.trials_per_task,
            max_trials=self.max_trials,
            builder_workers=self.builders,
            trials_per_iter=self.trials_per_iter,
            population=self.population,
            database=Path(self.output) if self.output else None,
        )


search_options = option_group(
    TuneSearch,
    "search",
    click.option(
        "--trials-per-task",
        default=64,
        show_default=True,
        type=click.IntRange(1),
        help="Measured candidates per kernel; kernels a database already holds this many of are "
        "skipped.",
    ),
    click.option(
        "--max-trials",
        type=click.IntRange(1),
        default=None,
        help="Cap on the candidates of this run.",
    ),
    click.option(
        "-o",
        "--output",
        type=click.Path(file_okay=False),
        default=None,
        help="Database folder to write (e.g. profiles/tvm/NAME); default: the target's cache "
        "folder.",
    ),
    click.option(
        "--trials-per-iter",
        type=click.IntRange(1, 64),
        default=None,
        help="Candidates per search round of a kernel (default: a quarter of --trials-per-task). "
        "With --max-trials below kernels x --trials-per-task, later rounds go to the kernels that "
        "gain most.",
    ),
    click.option(
        "--population",
        type=click.IntRange(2, 4096),
        default=None,
        help="Candidates the evolutionary search keeps per round of a kernel (default: 16 per "
        "candidate measured in a round, 32 to 512). Smaller searches faster and finds less.",
    ),
    click.option(
        "--builders",
        type=click.IntRange(1),
        default=None,
        help="Build processes (default: every core).",
    ),
)


@click.command("tune")
@click.argument("model", type=click.Path(dir_okay=False))
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
    search: TuneSearch,
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
            options=search.options(),
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
