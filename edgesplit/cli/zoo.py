"""``edgesplit zoo``: write a reference model built in code with seeded weights."""

from __future__ import annotations

import click

from edgesplit.cli.common import console, file_option
from edgesplit.cli.options import Verbosity, verbosity_options


@click.command("zoo")
@click.argument("name", required=False)
@file_option(
    "-o",
    "--output",
    help="Where to write the model (default NAME.onnx).",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the weights.")
@click.option("--list", "list_", is_flag=True, help="List the reference models.")
@verbosity_options
def command(
    name: str | None, output: str | None, seed: int, list_: bool, verbosity: Verbosity
) -> None:
    """Write the reference model NAME (or list them with --list)."""
    from edgesplit.model import zoo

    if list_ or name is None:
        for entry in zoo.ZOO.values():
            console.print(f"{entry.name:<20} {entry.description}")
        return
    path = zoo.save(name, output or f"{name}.onnx", seed=seed)
    console.print(f"wrote {path}")
