"""``edgesplit profile``: per-node latency on every processor of a device."""

from __future__ import annotations

from pathlib import Path

import click

from edgesplit.cli.common import console, device_option, input_shape_option, load_graph, progress_bar


@click.command("profile")
@click.argument("model", type=click.Path(dir_okay=False))
@device_option
@input_shape_option
@click.option("--backend", "backends", multiple=True, type=click.Choice(["ort", "tvm"]),
              help="Only these backends (repeatable); default all the device offers.")
@click.option("--processor", "processors", multiple=True, help="Only these processors (repeatable).")
@click.option("--runs", default=20, show_default=True, type=click.IntRange(1, 10000), help="Timed runs.")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(0, 10000), help="Untimed runs first.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Profile JSON (default MODEL.DEVICE.profile.json).")
@click.option("--top", default=10, show_default=True, help="Operators to show in the summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or table.")
def command(model, device, input_shapes, backends, processors, runs, warmup, output, top, quiet):
    """Measure (or predict) the latency of every node of MODEL on DEVICE."""
    from edgesplit.device import load_device
    from edgesplit.profile.run import profile_model

    graph = load_graph(model, input_shapes)
    spec = load_device(device)
    out = Path(output or f"{graph.name}.{spec.name}.profile.json")
    with progress_bar(not quiet) as update:
        prof = profile_model(graph, spec, backends=backends or None, processors=processors or None,
                             runs=runs, warmup=warmup, progress=update)
    prof.save(out)
    if not quiet:
        print_summary(graph, prof, top)
    console.print(f"wrote {out}")


def print_summary(graph, prof, top: int) -> None:
    from rich.table import Table

    totals = Table(title=f"{graph.name} on {prof.device}: totals per processor")
    for col in ("processor/backend", "source", "nodes", "sum of nodes ms", "whole model ms", "sum/whole", "time s", "note"):
        totals.add_column(col, justify="right" if "ms" in col or col in ("nodes", "sum/whole", "time s") else "left")
    for e in prof.entries:
        ratio = f"{e.sum_ms / e.whole_model_ms:.3f}" if e.whole_model_ms and e.nodes else "-"
        whole = f"{e.whole_model_ms:.3f}" if e.whole_model_ms is not None else "-"
        count = f"{len(e.nodes)}" + (f" (+{len(e.unsupported)} n/a)" if e.unsupported else "")
        totals.add_row(e.key, e.source, count, f"{e.sum_ms:.3f}", whole, ratio, f"{e.elapsed_s:.1f}", e.note[:60])
    console.print(totals)
    best = next((e for e in prof.entries if e.source == "measured" and e.nodes), None) or next(
        (e for e in prof.entries if e.nodes), None)
    if best is None:
        return
    ops = Table(title=f"top {top} operators on {best.key}")
    for col in ("node", "op", "GFLOPs", "median ms", "p90 ms", "share"):
        ops.add_column(col, justify="left" if col in ("node", "op") else "right")
    nodes = {n.name: n for n in graph.nodes}
    for name, c in sorted(best.nodes.items(), key=lambda kv: -kv[1].latency_ms)[:top]:
        share = c.latency_ms / best.sum_ms if best.sum_ms else 0.0
        ops.add_row(name[:40], nodes[name].op_type, f"{nodes[name].flops / 1e9:.3f}", f"{c.latency_ms:.3f}",
                    f"{c.p90_ms:.3f}", f"{share:.1%}")
    console.print(ops)
