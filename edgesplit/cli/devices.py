"""``edgesplit devices``: list the device specs, or show one."""

from __future__ import annotations

import click

from edgesplit.cli.common import console


@click.group("devices", invoke_without_command=True)
@click.pass_context
def command(ctx: click.Context) -> None:
    """List the shipped device specs (or run a subcommand)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_cmd)


@command.command("list")
def list_cmd() -> None:
    """List device, server and link specs with their processors."""
    from rich.table import Table

    from edgesplit.device import list_specs, load_device, load_links

    table = Table(title="device specs")
    for col in ("name", "kind", "processors", "description"):
        table.add_column(col)
    for path in list_specs():
        if path.stem == "links":
            presets = load_links(path)
            table.add_row("links", "links", ", ".join(presets), "network link presets (--link)")
            continue
        spec = load_device(path)
        procs = ", ".join(f"{p.name} ({p.kind}: {'+'.join(b.key for b in p.backends)})" for p in spec.processors)
        table.add_row(spec.name, spec.kind, procs, spec.description[:60])
    console.print(table)


@command.command("show")
@click.argument("name")
def show_cmd(name: str) -> None:
    """Show one spec's processors and figures."""
    from rich.table import Table

    from edgesplit.device import load_device

    spec = load_device(name)
    table = Table(title=f"{spec.name} ({spec.path})")
    for col in ("processor", "kind", "backends", "GFLOP/s", "GB/s", "active W", "idle W", "ops"):
        table.add_column(col)
    for p in spec.processors:
        ops = "all" if p.ops_only is None else f"{len(p.ops_only)} listed"
        if p.ops_exclude:
            ops += f" minus {len(p.ops_exclude)}"
        backends = ", ".join(b.provider if b.runtime == "ort" else f"tvm:{(b.target or {}).get('kind')}" for b in p.backends)
        table.add_row(p.name, p.kind, backends, f"{p.peak_gflops:g}", f"{p.mem_bandwidth_gbps:g}",
                      f"{p.active_w:g}", f"{p.idle_w:g}", ops)
    console.print(table)
