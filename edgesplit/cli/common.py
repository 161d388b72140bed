"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

if TYPE_CHECKING:
    import numpy as np

    from edgesplit.model.graph import ModelGraph
    from edgesplit.util import Progress
    from edgesplit.workflows.feedback import Feedback

_WIDTH = None if sys.stdout.isatty() else 160
console = Console(highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, width=_WIDTH)


def file_option(*decls: str, **kwargs: Any) -> Callable:
    """``click.option`` for a file's path (a folder is refused)."""
    return click.option(*decls, type=click.Path(dir_okay=False), **kwargs)


def folder_option(*decls: str, **kwargs: Any) -> Callable:
    """``click.option`` for a folder's path (a file is refused)."""
    return click.option(*decls, type=click.Path(file_okay=False), **kwargs)


def output_folder_option(help_text: str, dest: str = "output") -> Callable:
    """``-o``/``--output``, required: the folder the command writes, passed as ``dest``."""
    return folder_option("-o", "--output", dest, required=True, help=help_text)


model_argument = click.argument("model", type=click.Path(dir_okay=False))
"""MODEL: the ONNX file a command reads."""


def print_note(note: str) -> None:
    """A workflow's note (what loading changed, a choice it made) on stderr, as it comes."""
    err_console.print(f"note: {note}", soft_wrap=True)


input_shape_option = click.option(
    "--input-shape",
    "input_shapes",
    multiple=True,
    metavar="NAME=D1,D2,...",
    help="Static shape for an input with dynamic dimensions (repeatable).",
)
input_values_option = click.option(
    "--input",
    "input_values",
    multiple=True,
    metavar="NAME=FILE.npy",
    help="A sample value for an input (repeatable): profiling and checks run on it instead of "
    "made-up data; needed for an input whose values decide shapes, and one made-up values do not "
    "fill.",
)
device_option = click.option(
    "--device",
    "-d",
    default="host",
    show_default=True,
    metavar="NAME|FILE.yaml",
    help="A device spec name from devices/ or a path to a spec file.",
)


class FiniteFloat(click.ParamType):
    """A float flag that must be finite (``nan`` and ``inf`` are refused) and at least ``minimum``
    (above it with ``open_min``): usage errors (exit 2) before anything is loaded."""

    name = "number"

    def __init__(self, minimum: float | None = None, open_min: bool = False):
        self.minimum, self.open_min = minimum, open_min

    def convert(self, value, param, ctx):
        import math

        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.minimum is not None and (v < self.minimum or (self.open_min and v == self.minimum)):
            self.fail(
                f"{v:g} is not {'above' if self.open_min else 'at least'} {self.minimum:g}",
                param,
                ctx,
            )
        return v


class TableChoice(click.ParamType):
    """A choice among the names of a registry table, read when a value is checked or help is shown.

    The table is not imported when the command is (``edgesplit --help`` stays fast), and entries
    added at run time count.
    """

    name = "choice"

    def __init__(self, names: Callable[[], Iterable[str]]):
        self._names = names

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(self._names()) + "]"

    def convert(self, value, param, ctx):
        names = list(self._names())
        if value not in names:
            self.fail(f"{value!r} is not one of {', '.join(names)}", param, ctx)
        return value


def objective_names() -> Iterable[str]:
    from edgesplit.optimize.objectives import OBJECTIVES

    return OBJECTIVES


objective_option = click.option(
    "--objective",
    default="latency",
    show_default=True,
    type=TableChoice(objective_names),
    help="What to minimise (see edgesplit.optimize.objectives).",
)


split_option = click.option(
    "--split-operators",
    is_flag=True,
    help="A latency plan may split operators across two processors at once (rows or channels).",
)


def backend_names() -> Iterable[str]:
    from edgesplit.device.spec import BACKENDS

    return BACKENDS


backend_option = click.option(
    "--backend",
    "backends",
    multiple=True,
    type=TableChoice(backend_names),
    help="Profile only these backends (repeatable); default all the device offers.",
)
runs_option = click.option(
    "--runs",
    default=20,
    show_default=True,
    type=click.IntRange(1),
    help="Timed runs per measurement, where the device is measured (no --profile).",
)
slo_option = click.option(
    "--slo-ms",
    type=FiniteFloat(minimum=0, open_min=True),
    help="Latency limit in ms (energy, pareto).",
)


_STAGE_HELP = {
    "load": "reading, checking and shaping the model, simplifying included",
    "simplify": "folding its shape computations (onnxslim) and inferring shapes",
    "profile": "measuring every processor",
    "compile": "extracting, checking and building the parts",
}


def _set_stage_limit(ctx: click.Context, param: click.Parameter, value: float | None) -> None:
    if value is not None and not ctx.resilient_parsing:
        from dataclasses import replace

        from edgesplit import limits

        before = limits.current()
        limits.configure(replace(before, **{f"{param.name.removesuffix('_timeout_s')}_s": value}))
        ctx.call_on_close(lambda: limits.configure(before))  # for a command run in-process


def stage_limit_options(f):
    """``--load-timeout-s``, ``--simplify-timeout-s``, ``--profile-timeout-s``,
    ``--compile-timeout-s``: each stage's time limit for this command (:mod:`edgesplit.limits`)."""
    from edgesplit.limits import STAGES, StageLimits

    for stage in reversed(STAGES):
        f = click.option(
            f"--{stage}-timeout-s",
            type=FiniteFloat(minimum=0, open_min=True),
            default=None,
            expose_value=False,
            callback=_set_stage_limit,
            help=f"Time limit for {_STAGE_HELP[stage]} [default: "
            f"{getattr(StageLimits(), f'{stage}_s'):g}].",
        )(f)
    return f


force_option = click.option(
    "--force",
    is_flag=True,
    help="Replace the output directory even if it holds something other than an edgesplit bundle.",
)
sign_key_option = file_option(
    "--sign-key",
    metavar="KEY",
    help="Sign the bundle's manifest with this ed25519 private key (see 'edgesplit keygen').",
)
trust_key_option = file_option(
    "--trust-key",
    metavar="PUBKEY",
    help="Load the bundle only if its manifest is signed by this ed25519 public key.",
)


pin_option = click.option(
    "--pin",
    "pins",
    multiple=True,
    metavar="NODE=PROC",
    help="Force a node onto a processor (repeatable).",
)


def model_inputs(input_shapes: tuple[str, ...], input_values: tuple[str, ...]) -> dict:
    """``--input-shape`` and ``--input`` parsed, as the ``input_shapes`` and ``input_values`` fields
    of :class:`edgesplit.workflows.resolve.Choices`."""
    from edgesplit.model.load import parse_input_shapes, parse_input_values

    return {
        "input_shapes": parse_input_shapes(input_shapes) or None,
        "input_values": parse_input_values(input_values) or None,
    }


def load_graph(
    model: str,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
) -> ModelGraph:
    """Load MODEL for a subcommand with the pipeline's loader, and print what loading changed (an
    opset upgrade, folding skipped ...) before anything long starts."""
    from edgesplit.workflows.resolve import load_graph as load

    graph = load(model, input_shapes, input_values)
    for note in graph.notes:
        err_console.print(f"note: {model}: {note}", soft_wrap=True)
    return graph


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress]:
    """A rich progress bar with one row per label; yields ``update(label, done, total)``.

    The bar starts at the first update: a command with nothing to show prints nothing. A command
    that fails leaves no bar (erased on a terminal, never printed to a file), so its error is one
    line.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bar

    if not enabled:
        yield lambda label, done, total: None
        return
    tasks: dict[str, int] = {}
    bars: list[Bar] = []

    def update(label: str, done: int, total: int) -> None:
        if not bars:
            bars.append(
                Bar(
                    TextColumn("{task.description:<24}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),  # the ETA, from the rate so far (tuning, profiling)
                    console=err_console,
                    transient=False,
                )
            )
            bars[0].start()
        if label not in tasks:
            tasks[label] = bars[0].add_task(label, total=total)
        bars[0].update(tasks[label], completed=done, total=total)

    try:
        yield update
    except BaseException:
        if bars:
            bars[0].live.transient = True
            bars[0].live.stop()  # not Progress.stop: it prints an empty line to a file
            bars.clear()
        raise
    finally:
        if bars:
            bars[0].stop()


@contextlib.contextmanager
def feedback(enabled: bool = True) -> Iterator[Feedback]:
    """A workflow's :class:`~edgesplit.workflows.feedback.Feedback`: the :func:`progress_bar`
    (when ``enabled``) and its notes on stderr as they come (:func:`print_note`)."""
    from edgesplit.workflows.feedback import Feedback

    with progress_bar(enabled) as update:
        yield Feedback(update, print_note)
