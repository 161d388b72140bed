"""``edgesplit cache``: what is kept between runs, and clearing it (:mod:`edgesplit.cache`)."""

from __future__ import annotations

import click

from edgesplit.cli.common import console
from edgesplit.cli.options import Verbosity, verbosity_options


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


@click.command("cache")
@click.option(
    "--clear",
    "kinds",
    multiple=True,
    metavar="KIND",
    help="Delete one kind of kept work (repeatable): simplified, tvm-libs, calibration, accuracy, "
    "tvm-tuning, or all (every kind but tvm-tuning, whose records only hours of tuning make "
    "again).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print what is kept (or was cleared) as JSON."
)
@verbosity_options
def command(kinds: tuple[str, ...], as_json: bool, verbosity: Verbosity) -> None:
    """Show what edgesplit keeps between runs under $EDGESPLIT_CACHE (default ~/.cache/edgesplit):
    every kind's files and size, and the most it may take; with --clear, delete kinds of it. A
    cleared kind costs time only: the next run makes what it needs again."""
    import json
    from dataclasses import asdict

    from rich.table import Table

    from edgesplit.cache import cache_root, clear, others, usage

    if kinds:
        rows = clear(kinds)  # an unknown kind is refused before anything is deleted
        title = f"cleared from {cache_root()}"
    else:
        rows = usage()
        title = f"kept under {cache_root()}"
    if as_json:
        click.echo(json.dumps([{**asdict(r), "path": str(r.path)} for r in rows], indent=1))
        return
    table = Table(title=title)
    for col in ("kind", "files", "size", "at most", "holds"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.kind, str(r.n_files), _size(r.nbytes), _size(r.max_nbytes), r.holds)
    if not verbosity.quiet:
        console.print(table)
    if kinds and not rows:
        console.print("nothing to clear: those kinds hold nothing")
    for other in [] if kinds else others():
        console.print(f"not edgesplit's kept work (never cleared here): {other}")
