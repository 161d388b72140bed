"""The ``edgesplit`` command: a group whose subcommands live one per module, imported lazily."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from edgesplit.errors import EdgesplitError

# name -> module; each module defines a click command called ``command``. Heavy imports stay
# inside the commands, so ``edgesplit --help`` is fast.
SUBCOMMANDS: dict[str, str] = {
    "zoo": "edgesplit.cli.zoo",
    "devices": "edgesplit.cli.devices",
    "profile": "edgesplit.cli.profile",
    "partition": "edgesplit.cli.partition",
    "explain": "edgesplit.cli.explain",
    "tune": "edgesplit.cli.tune",
    "compile": "edgesplit.cli.compile",
    "run": "edgesplit.cli.run",
    "deploy": "edgesplit.cli.deploy",
    "refit": "edgesplit.cli.refit",
    "serve": "edgesplit.cli.serve",
    "export-triton": "edgesplit.cli.export_triton",
    "keygen": "edgesplit.cli.keygen",
    "cache": "edgesplit.cli.cache",
    "fleet": "edgesplit.cli.fleet",
}


ALIASES: dict[str, str] = {"calibrate": "refit"}
"""Old names that still work (not listed): ``calibrate`` was ``refit`` before "calibration" came to
mean int8 ranges only."""


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n, m in SUBCOMMANDS.items() if importlib.util.find_spec(m) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = SUBCOMMANDS.get(ALIASES.get(name, name))
        if module is None or importlib.util.find_spec(module) is None:
            return None
        return importlib.import_module(module).command


def debug_enabled() -> bool:
    return os.environ.get("EDGESPLIT_DEBUG", "") not in ("", "0")


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        import edgesplit

        click.echo(f"edgesplit {edgesplit.__version__}")
        ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug",
    is_flag=True,
    help="Show full tracebacks (or set EDGESPLIT_DEBUG=1). Works before or after the subcommand.",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version.",
)
def cli(debug: bool) -> None:
    """Split a neural network across the processors of an edge device and a server."""
    if debug:
        os.environ["EDGESPLIT_DEBUG"] = "1"


def abort(message: str, code: int) -> None:
    """The one way out on error: a one-line message on stderr and an exit code."""
    click.echo(f"edgesplit: error: {message}", err=True)
    sys.exit(code)


def take_debug_flag(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without ``--debug``, and whether it was there: the flag belongs to the group, but
    it is accepted anywhere before a ``--``, so ``edgesplit partition ... --debug`` works too."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != "--debug"]
    return kept + args[end:], len(kept) < end


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: maps errors to exit codes and one-line messages."""
    args, debug = take_debug_flag(list(sys.argv[1:] if argv is None else argv))
    if debug:
        os.environ["EDGESPLIT_DEBUG"] = "1"
    from edgesplit import limits

    limits.on_overrun(_overrun)
    try:
        cli.main(args=args, prog_name="edgesplit", standalone_mode=False)
    except click.exceptions.Abort:
        abort("interrupted", 130)
    except click.UsageError as e:
        _traceback_if_debug()
        abort(e.format_message().replace("\n", " "), 2)
    except click.ClickException as e:
        abort(e.format_message(), e.exit_code)
    except EdgesplitError as e:
        _traceback_if_debug()
        abort(str(e).replace("\n", " "), e.exit_code)
    except KeyboardInterrupt:
        abort("interrupted", 130)
    except Exception as e:  # noqa: BLE001 - the last line of defence: no traceback without --debug
        _traceback_if_debug()
        abort(f"{type(e).__name__}: {e} (run with --debug for the traceback)".replace("\n", " "), 1)
    sys.exit(0)


def _overrun(e: EdgesplitError) -> None:
    """A stage still running past its time limit and a grace period, in a call that could not be
    stopped (a TVM build, say): the command ends here, with the stage's one-line error."""
    click.echo(f"edgesplit: error: {e}", err=True)
    sys.stderr.flush()
    os._exit(e.exit_code)


def _traceback_if_debug() -> None:
    """With --debug, the traceback goes to stderr first; the exit code stays the error's own."""
    if debug_enabled():
        import traceback

        traceback.print_exc()
