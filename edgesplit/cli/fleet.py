"""``edgesplit fleet``: plan many devices of several kinds that share one batching server."""

from __future__ import annotations

import click

from edgesplit.cli.common import console, output_folder_option, progress_bar
from edgesplit.cli.options import Verbosity, verbosity_options


@click.group("fleet")
def command() -> None:
    """Plan a fleet: groups of devices (spec, count, link, deadline) sharing one server."""


@command.command("plan")
@click.argument("fleet_file", type=click.Path(dir_okay=False))
@output_folder_option(
    "Folder to write: groups/NAME/plan.json, server/serve.args, fleet-report.json.", "out"
)
@click.option(
    "--max-candidates",
    type=click.IntRange(min=1),
    default=12,
    show_default=True,
    help="Candidate plans kept per group.",
)
@click.option(
    "--bundles",
    is_flag=True,
    help="Also compile each group's plan into groups/NAME/bundle and write the server parts as "
    "a Triton repository, server/triton (takes a compile per distinct plan).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--force", is_flag=True, help="Replace an output folder that is not a fleet plan.")
@verbosity_options
def plan_cmd(
    fleet_file: str,
    out: str,
    max_candidates: int,
    bundles: bool,
    as_json: bool,
    force: bool,
    verbosity: Verbosity,
) -> None:
    """Choose every group's plan and the server's batching together: the fleet's device energy
    is cut under each group's p95 deadline, with the server's queueing and batching priced."""
    import json

    from edgesplit.workflows.fleet import plan_fleet_file

    with progress_bar(not verbosity.quiet and not as_json) as progress:
        result = plan_fleet_file(
            fleet_file,
            out,
            progress=progress,
            max_candidates=max_candidates,
            force=force,
            bundles=bundles,
        )
    if as_json:
        click.echo(json.dumps(result.report, indent=1))
    elif not verbosity.quiet:
        _print(result)


def _print(result) -> None:
    from rich.table import Table

    r = result.report
    table = Table(title=f"fleet plan ({r['fleet']['devices']} devices) -> {result.out}")
    for col in ("group", "count", "plan", "p50 ms", "p95 ms", "deadline", "mJ/request", "met"):
        table.add_column(col)
    for g in r["groups"]:
        table.add_row(
            g["group"],
            str(g["count"]),
            g["plan"],
            f"{g['p50_ms']:.2f}",
            f"{g['p95_ms']:.2f}",
            f"{g['deadline_p95_ms']:g}",
            f"{g['device_energy_mj']:.3f}",
            "yes" if g["meets_deadline"] else "NO",
        )
    console.print(table)
    s = r["server"]
    console.print(
        f"server: {s['replicas']} replica(s), utilisation {s['utilisation']:.0%}, "
        f"serve {s['serve_args']}; planned in {r['search']['time_s']:.2f} s "
        f"({r['search']['method']})"
    )
    for k, names in r["shared_parts"].items():
        console.print(f"shared server part {k}: {', '.join(names)}")
    for c in r["sharing_costs"]:
        console.print(
            f"{c['group']}: alone it would run {c['own_best']}; the fleet plan "
            f"{c['fleet_plan']} saves the fleet {c['saves_fleet_energy_mj_per_s']:.3f} mJ/s"
        )
    for c in r["not_shared"]:
        cost = c.get("costs_group_energy_mj", c.get("costs_group_p95_ms"))
        console.print(
            f"{c['group']} does not share {c['plan']} with {', '.join(c['with'])}: it would cost "
            f"the group {cost:+.3f} and the server {c['server_utilisation_change']:+.1%} "
            f"utilisation{'' if c['meets_deadline'] else ', and miss its deadline'}"
        )
    if "triton" in r:
        t = r["triton"]
        console.print(
            f"bundles: groups/NAME/bundle; Triton repository {t['repository']} "
            f"(max batch {t['max_batch']}, queue delay {t['max_queue_delay_ms']:g} ms, "
            f"{t['instances']} instance(s) per model)"
        )
    for name in r["unmet"]:
        console.print(f"[red]{name}: no plan meets its deadline; its best effort is planned[/red]")
