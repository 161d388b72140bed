"""``edgesplit devices``: list the device specs, show one, or draft one by probing a device."""

from __future__ import annotations

import click

from edgesplit.cli.common import console, file_option
from edgesplit.cli.options import RemoteFlags, Verbosity, remote_options, verbosity_options


@click.group("devices", invoke_without_command=True)
@click.pass_context
def command(ctx: click.Context) -> None:
    """List the shipped device specs (or run a subcommand)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_cmd)


@command.command("list")
@verbosity_options
def list_cmd(verbosity: Verbosity) -> None:
    """List device, server and link specs with their processors."""
    from rich.table import Table

    from edgesplit.device.spec import list_specs, load_device, load_links

    table = Table(title="device specs")
    for col in ("name", "kind", "processors", "description"):
        table.add_column(col)
    for path in list_specs():
        if path.stem == "links":
            presets = load_links(path)
            table.add_row("links", "links", ", ".join(presets), "network link presets (--link)")
            continue
        spec = load_device(path)
        procs = ", ".join(
            f"{p.name} ({p.kind}: {'+'.join(b.key for b in p.backends)})" for p in spec.processors
        )
        table.add_row(spec.name, spec.kind, procs, spec.description[:60])
    if not verbosity.quiet:
        console.print(table)


@command.command("show")
@click.argument("name")
@verbosity_options
def show_cmd(name: str, verbosity: Verbosity) -> None:
    """Show one spec's processors and figures."""
    from rich.table import Table

    from edgesplit.device.spec import load_device

    spec = load_device(name)
    table = Table(title=f"{spec.name} ({spec.path})")
    for col in ("processor", "kind", "backends", "GFLOP/s", "GB/s", "active W", "idle W", "ops"):
        table.add_column(col)
    for p in spec.processors:
        ops = "all" if p.ops_only is None else f"{len(p.ops_only)} listed"
        if p.ops_exclude:
            ops += f" minus {len(p.ops_exclude)}"
        backends = ", ".join(
            f"{b.runtime}:{b.target.get('kind')}" if b.target is not None else b.provider
            for b in p.backends
        )
        table.add_row(
            p.name,
            p.kind,
            backends,
            f"{p.peak_gflops:g}",
            f"{p.mem_bandwidth_gbps:g}",
            f"{p.active_w:g}",
            f"{p.idle_w:g}",
            ops,
        )
    if not verbosity.quiet:
        console.print(table)


@command.command("detect")
@remote_options("Probe this host over SSH (default: this machine).")
@click.option(
    "--name", help="The spec's name (default: the output file's stem, else the host name)."
)
@file_option(
    "-o",
    "--output",
    help="Write the spec here (default: print it).",
)
@verbosity_options
def detect_cmd(
    remote: RemoteFlags, name: str | None, output: str | None, verbosity: Verbosity
) -> None:
    """Draft a device spec from what a device has: CPU clusters, memory, GPU/NPU nodes, runtimes."""
    from pathlib import Path

    from rich.table import Table

    from edgesplit.device.draft import draft_spec, to_yaml
    from edgesplit.util import atomic_write_text

    if remote.remote:
        from edgesplit.profile.remote import detect_remote

        facts = detect_remote(remote.remote, remote.ssh())
    else:
        from edgesplit.device.detect import probe

        facts = probe()
    draft = draft_spec(facts, name or (Path(output).stem if output else None))
    text = to_yaml(draft, output or "<detected spec>")
    if not output:
        click.echo(text, nl=False)
        return
    atomic_write_text(output, text)
    table = Table(
        title=f"{draft.data['name']}: drafted from "
        f"{facts.get('ssh_target') or facts.get('hostname')}"
    )
    for col in ("processor", "kind", "cores", "backends", "GFLOP/s (est.)", "description"):
        table.add_column(col)
    for key, p in draft.data["processors"].items():
        backends = ", ".join(b.get("provider") or b["runtime"] for b in p["backends"])
        table.add_row(
            key,
            p["kind"],
            str(len(p.get("cores", []))) if "cores" in p else "-",
            backends,
            f"{p['peak_gflops']:g}",
            p.get("description", ""),
        )
    if not verbosity.quiet:
        console.print(table)
    for line in draft.header:
        if "missing" in line or "install" in line:
            console.print(f"note: {line}")
    console.print(f"wrote {output}")
