"""``edgesplit explain``: what a plan's decision depends on (its bandwidth sweep)."""

from __future__ import annotations

import click

from edgesplit.cli.common import console, file_option
from edgesplit.cli.options import Verbosity, verbosity_options


@click.command("explain")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option(
    "--bandwidth-sweep", is_flag=True, help="Re-solve from 0.1 to 1000 Mbit/s (log-spaced)."
)
@click.option(
    "--per-decade",
    default=4,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Bandwidths per decade in the sweep.",
)
@click.option(
    "--bands",
    "bands",
    is_flag=True,
    help="The band table: each band plan's latency against bandwidth, and their envelope.",
)
@file_option("--plot", "plot_path", help="Write the sweep as a PNG.")
@verbosity_options
def command(
    plan_path: str,
    bandwidth_sweep: bool,
    per_decade: int,
    bands: bool,
    plot_path: str | None,
    verbosity: Verbosity,
) -> None:
    """Explain PLAN: its parts, and with --bandwidth-sweep where the decision changes."""
    from edgesplit.cli.partition import print_plan
    from edgesplit.optimize.plan import load_plan

    plan = load_plan(plan_path)
    if bands:
        explain_bands(plan, per_decade, plot_path, verbosity.quiet)
    elif bandwidth_sweep:
        explain_sweep(plan, per_decade, plot_path, verbosity.quiet)
    elif not verbosity.quiet:
        print_plan(plan)


def explain_sweep(plan, per_decade: int, plot_path: str | None, quiet: bool = False) -> None:
    """The plan's problem solved again from 0.1 to 1000 Mbit/s: where the decision changes."""
    from rich.table import Table

    from edgesplit.optimize.sweep import bandwidth_sweep as sweep
    from edgesplit.optimize.sweep import log_bandwidths, needs_network
    from edgesplit.workflows.resolve import problem_from_plan

    needs_network(bool(plan.server and plan.link))  # before the problem is loaded (and measured)
    rows = sweep(problem_from_plan(plan), log_bandwidths(0.1, 1000.0, per_decade))
    names = list(dict.fromkeys(k for r in rows for k in r.baselines))
    table = Table(
        title=f"{plan.model_name} on {plan.device} + {plan.server}: latency against bandwidth"
    )
    for col in ("Mbit/s", "plan ms", "mJ", *names, "decision"):
        table.add_column(col, justify="left" if col == "decision" else "right")
    for r in rows:
        cells = [f"{r.baselines[n]:.2f}" if r.baselines.get(n) is not None else "-" for n in names]
        mark = "* " if r.changed else "  "
        table.add_row(
            f"{r.bandwidth_mbps:g}",
            f"{r.latency_ms:.3f}",
            f"{r.energy_mj:.2f}",
            *cells,
            mark + r.decision,
        )
    if not quiet:
        console.print(table)
    changes = [r.bandwidth_mbps for r in rows if r.changed]
    console.print(
        "the decision changes at "
        + (
            ", ".join(f"{b:g}" for b in changes) + " Mbit/s (marked *)"
            if changes
            else "no bandwidth in the sweep"
        )
    )
    if plot_path:
        from edgesplit.optimize.plot import sweep_plot

        sweep_plot(rows, plot_path, f"{plan.model_name} on {plan.device} + {plan.server}")
        console.print(f"wrote {plot_path}")


def explain_bands(plan, per_decade: int, plot_path: str | None, quiet: bool = False) -> None:
    """The band table of ``plan``'s problem, each plan's value on a log grid, and the envelope."""
    from rich.table import Table

    from edgesplit.optimize.bands import curves, problem_band_table, problem_pricings
    from edgesplit.optimize.objectives import OBJECTIVES
    from edgesplit.optimize.sweep import log_bandwidths, needs_network
    from edgesplit.workflows.resolve import problem_from_plan

    needs_network(bool(plan.server and plan.link))
    problem = problem_from_plan(plan)
    table = problem_band_table(problem)
    grid = sorted(
        {*log_bandwidths(table.lo_mbps, table.hi_mbps, per_decade), *table.breakpoints_mbps}
    )
    values = curves(problem_pricings(problem), table.objective, table.assigns, grid, table.pricing)
    unit = OBJECTIVES[table.objective].unit
    t = Table(
        title=f"{plan.model_name}: {table.objective} ({unit}) of each band plan against uplink rate"
    )
    for col in ("Mbit/s", *(f"plan {k}" for k in range(len(table.assigns))), "envelope", "best"):
        t.add_column(col, justify="right")
    for i, bw in enumerate(grid):
        col = [v[i] for v in values]
        best = table.band_at(bw).plan
        mark = " (breakpoint)" if bw in table.breakpoints_mbps else ""
        t.add_row(f"{bw:.4g}", *(f"{x:.3f}" for x in col), f"{min(col):.3f}", f"plan {best}{mark}")
    if not quiet:
        console.print(t)
    for k, d in enumerate(table.decisions):
        where = ", ".join(f"{b.lo_mbps:.4g}-{b.hi_mbps:.4g}" for b in table.bands if b.plan == k)
        console.print(f"plan {k}: {d} (best at {where} Mbit/s)")
    console.print(
        f"breakpoints: {', '.join(f'{b:.6g}' for b in table.breakpoints_mbps) or 'none'} Mbit/s "
        f"({table.solver_calls} solver runs, {table.time_s:.2f} s)"
    )
    if plot_path:
        from edgesplit.optimize.plot import bands_plot

        bands_plot(
            grid, values, table.breakpoints_mbps, plot_path, f"{plan.model_name}: band plans", unit
        )
        console.print(f"wrote {plot_path}")
