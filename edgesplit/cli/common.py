"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import click
from rich.console import Console

_WIDTH = None if sys.stdout.isatty() else 160
console = Console(highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, width=_WIDTH)

input_shape_option = click.option(
    "--input-shape",
    "input_shapes",
    multiple=True,
    metavar="NAME=D1,D2,...",
    help="Static shape for an input with dynamic dimensions (repeatable).",
)
device_option = click.option(
    "--device",
    "-d",
    default="host",
    show_default=True,
    metavar="NAME|FILE.yaml",
    help="A device spec name from devices/ or a path to a spec file.",
)


def load_graph(model: str, input_shapes: tuple[str, ...]):
    from edgesplit.model.load import load_model, parse_input_shapes

    return load_model(model, parse_input_shapes(input_shapes))


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar with one row per label; yields ``update(label, done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled:
        yield lambda label, done, total: None
        return
    with Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    ) as bar:
        tasks: dict[str, int] = {}

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done, total=total)

        yield update
