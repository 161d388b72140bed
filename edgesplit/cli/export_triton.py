"""``edgesplit export-triton``: a Triton model repository for a bundle's server parts."""

from __future__ import annotations

import click

from edgesplit.cli.common import console, output_folder_option
from edgesplit.cli.options import Batching, Verbosity, batching_options, verbosity_options


@click.command("export-triton")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@output_folder_option("The model repository to write (replaced if it exists).", "repo")
@click.option("--all-parts", is_flag=True, help="Export every part, not only the server parts.")
@batching_options(
    "Triton dynamic batching: requests per batch at most (1: none), as 'serve --max-batch'. "
    "Parts that cannot batch keep max_batch_size 0 (a note says why).",
    "Triton's max_queue_delay_microseconds, in ms, as 'serve --max-queue-delay-ms'.",
)
@verbosity_options
def command(
    bundle: str, repo: str, all_parts: bool, batching: Batching, verbosity: Verbosity
) -> None:
    """Write REPO/<part>/config.pbtxt and REPO/<part>/1/model.onnx for BUNDLE's server parts.

    Server parts that feed each other are also chained in an 'ensemble' model. Serve it with
    'tritonserver --model-repository REPO'; 'edgesplit run --server URL' talks to it unchanged.
    """
    from edgesplit.cli.common import err_console
    from edgesplit.compile.triton import export_triton

    result = export_triton(
        bundle,
        repo,
        all_parts=all_parts,
        max_batch=batching.max_batch,
        max_queue_delay_ms=batching.max_queue_delay_ms,
    )
    for name, why in result.unbatched:
        err_console.print(f"note: {name}: not batched: {why}")
    for name, backend in result.as_onnx:
        err_console.print(
            f"note: {name}: Triton runs its ONNX file in ONNX Runtime (fp32), not its {backend} "
            "artifact "
            "(the plan's figures for it do not hold there; 'edgesplit serve' runs the artifact)"
        )
    console.print(
        f"wrote {result.repo}: {len(result.models)} model(s) ({', '.join(result.models)})"
        + (f", ensemble(s) {', '.join(result.ensembles)}" if result.ensembles else "")
    )
