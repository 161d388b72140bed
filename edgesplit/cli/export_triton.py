"""``edgesplit export-triton``: a Triton model repository for a bundle's server parts."""

from __future__ import annotations

import click

from edgesplit.cli.common import console


@click.command("export-triton")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option(
    "-o",
    "--output",
    "repo",
    required=True,
    type=click.Path(file_okay=False),
    help="The model repository to write (replaced if it exists).",
)
@click.option("--all-parts", is_flag=True, help="Export every part, not only the server parts.")
def command(bundle: str, repo: str, all_parts: bool) -> None:
    """Write REPO/<part>/config.pbtxt and REPO/<part>/1/model.onnx for BUNDLE's server parts.

    Server parts that feed each other are also chained in an 'ensemble' model. Serve it with
    'tritonserver --model-repository REPO'; 'edgesplit run --server URL' talks to it unchanged.
    """
    from edgesplit.compile.triton import export_triton

    result = export_triton(bundle, repo, all_parts=all_parts)
    console.print(
        f"wrote {result.repo}: {len(result.models)} model(s) ({', '.join(result.models)})"
        + (f", ensemble(s) {', '.join(result.ensembles)}" if result.ensembles else "")
    )
