"""``edgesplit deploy``: profile, partition and compile in one step."""

from __future__ import annotations

import click

from edgesplit.cli.common import console, device_option, input_shape_option, progress_bar


@click.command("deploy")
@click.argument("model", type=click.Path(dir_okay=False))
@device_option
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@click.option(
    "--objective",
    default="latency",
    show_default=True,
    type=click.Choice(["latency", "energy", "throughput"]),
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False),
    help="Use this profile instead of measuring.",
)
@click.option("--server", default=None, help="Server spec to offload to (e.g. server-a100).")
@click.option("--link", default=None, help="Network link preset (wifi, lte, 5g ...).")
@click.option("--bandwidth-mbps", type=float, default=None, help="Override the link's bandwidth.")
@click.option("--rtt-ms", type=float, default=None, help="Override the link's round-trip time.")
@click.option("--slo-ms", type=float, default=None, help="Latency bound for the energy objective.")
@click.option("--pin", "pins", multiple=True, metavar="NODE=PROC", help="Force a node onto a processor.")
@input_shape_option
@click.option("--runs", default=10, show_default=True, help="Timed runs per measurement.")
@click.option("--tune-trials", default=0, show_default=True, help="MetaSchedule trials for TVM parts.")
def command(
    model,
    device,
    output,
    objective,
    profile_path,
    server,
    link,
    bandwidth_mbps,
    rtt_ms,
    slo_ms,
    pins,
    input_shapes,
    runs,
    tune_trials,
):
    """Profile MODEL on DEVICE, partition it and compile a bundle."""
    from edgesplit.cli.compile import print_manifest
    from edgesplit.deploy import deploy
    from edgesplit.errors import InputError
    from edgesplit.model.load import parse_input_shapes

    pin_map = {}
    for p in pins:
        node, sep, proc = p.partition("=")
        if not sep:
            raise InputError(f"--pin '{p}' is not NODE=PROC")
        pin_map[node] = proc
    with progress_bar() as update:
        manifest = deploy(
            model,
            device,
            output,
            objective=objective,
            profile=profile_path,
            server=server,
            link=link,
            bandwidth_mbps=bandwidth_mbps,
            rtt_ms=rtt_ms,
            slo_ms=slo_ms,
            pins=pin_map,
            input_shapes=parse_input_shapes(input_shapes) or None,
            runs=runs,
            tune_trials=tune_trials,
            progress=update,
        )
    print_manifest(manifest)
    pred = manifest.plan.get("predicted", {})
    if pred:
        console.print(
            f"predicted: {pred.get('latency_ms', float('nan')):.3f} ms, "
            f"{pred.get('energy_mj', float('nan')):.3f} mJ per inference"
        )
    console.print(f"wrote {output}")
