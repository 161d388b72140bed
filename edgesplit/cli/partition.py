"""``edgesplit partition``: choose which processor runs each node, and write the plan."""

from __future__ import annotations

from pathlib import Path

import click

from edgesplit.cli.common import console, device_option, input_shape_option, load_graph


def _pins(values: tuple[str, ...]) -> dict[str, str]:
    from edgesplit.errors import PlanError

    out = {}
    for v in values:
        node, sep, proc = v.rpartition("=")
        if not sep or not node or not proc:
            raise PlanError(f"--pin '{v}' is not NODE=PROCESSOR")
        out[node] = proc
    return out


@click.command("partition")
@click.argument("model", type=click.Path(dir_okay=False))
@device_option
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False),
    help="A profile JSON of MODEL on DEVICE (default: measure what is local, predict the rest).",
)
@input_shape_option
@click.option(
    "--objective",
    default="latency",
    show_default=True,
    type=click.Choice(["latency", "energy", "throughput", "pareto"]),
)
@click.option("--slo-ms", type=click.FloatRange(min=0, min_open=True), help="Latency limit in ms.")
@click.option("--server", help="A server spec whose processors may take parts.")
@click.option("--link", "link_name", help="Network preset from devices/links.yaml (wifi, lte, 5g ...).")
@click.option("--bandwidth-mbps", type=float, help="Network bandwidth, up and down (overrides the preset).")
@click.option("--rtt-ms", type=float, help="Network round-trip time (overrides the preset).")
@click.option(
    "--pin", "pins", multiple=True, metavar="NODE=PROC", help="Force a node onto a processor (repeatable)."
)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a Gantt chart (PNG).")
@click.option("-o", "--output", default="plan.json", show_default=True, type=click.Path(dir_okay=False))
@click.option(
    "--onnx-out",
    type=click.Path(dir_okay=False),
    help="Annotated model copy (default: beside the plan, PLAN.onnx).",
)
@click.option("--quiet", "-q", is_flag=True, help="No tables.")
def command(
    model,
    device,
    profile_path,
    input_shapes,
    objective,
    slo_ms,
    server,
    link_name,
    bandwidth_mbps,
    rtt_ms,
    pins,
    plot_path,
    output,
    onnx_out,
    quiet,
):
    """Split MODEL across the processors of DEVICE (and a server) for an objective."""
    from edgesplit.device import load_device, network_link
    from edgesplit.errors import PlanError
    from edgesplit.optimize.annotate import write_annotated
    from edgesplit.optimize.api import partition
    from edgesplit.profile.store import load_profile

    graph = load_graph(model, input_shapes)
    spec = load_device(device)
    srv = load_device(server) if server else None
    if srv is None and (link_name or bandwidth_mbps is not None or rtt_ms is not None):
        raise PlanError("--link, --bandwidth-mbps and --rtt-ms need --server")
    link = network_link(link_name, bandwidth_mbps=bandwidth_mbps, rtt_ms=rtt_ms) if srv is not None else None
    out = Path(output)
    if profile_path:
        prof = load_profile(profile_path)
    else:
        from edgesplit.profile.run import profile_model

        full = spec.with_server(srv) if srv is not None else spec
        prof = profile_model(graph, full)
        profile_path = str(out.with_suffix(".profile.json"))
        prof.save(profile_path)
    plan = partition(
        graph, spec, objective=objective, profile=prof, server=srv, link=link, slo_ms=slo_ms, pins=_pins(pins)
    )
    import os
    from dataclasses import replace

    plan = replace(plan, profile_path=os.path.abspath(profile_path))
    plan.save(out)
    onnx_path = Path(onnx_out) if onnx_out else out.with_suffix(".onnx")
    if onnx_path.resolve() == Path(model).resolve():
        if onnx_out:
            raise PlanError(f"--onnx-out {onnx_out} would overwrite the model")
        onnx_path = out.with_suffix(".annotated.onnx")  # never overwrite the input model
    write_annotated(graph.model, plan, onnx_path)
    if plot_path:
        from edgesplit.optimize.plot import gantt

        gantt(plan, plot_path)
    if not quiet:
        print_plan(plan)
    console.print(f"wrote {out} and {onnx_path}" + (f" and {plot_path}" if plot_path else ""))


def print_plan(plan) -> None:
    from rich.table import Table

    parts = Table(
        title=f"{plan.model_name} on {plan.device}"
        + (f" + {plan.server}" if plan.server else "")
        + f" ({plan.objective})"
    )
    for col in ("part", "processor", "backend", "nodes", "stage", "start ms", "end ms", "predicted ms", "mJ"):
        parts.add_column(col, justify="right" if col not in ("part", "processor", "backend") else "left")
    for p in plan.parts:
        parts.add_row(
            p.name,
            p.processor,
            p.backend,
            str(len(p.nodes)),
            str(p.stage),
            f"{p.start_ms:.3f}",
            f"{p.end_ms:.3f}",
            f"{p.latency_ms:.3f}",
            f"{p.energy_mj:.3f}",
        )
    console.print(parts)
    moving = [t for t in plan.transfers if t.latency_ms > 0]
    if moving:
        xt = Table(title=f"transfers ({len(moving)})")
        for col in ("tensor", "bytes", "from", "to", "ms", "mJ"):
            xt.add_column(col, justify="right" if col in ("bytes", "ms", "mJ") else "left")
        for t in moving[:30]:
            xt.add_row(
                t.tensor[:40],
                f"{t.nbytes:,}",
                f"{t.src_part} ({t.src_processor})",
                f"{t.dst_part} ({t.dst_processor})",
                f"{t.latency_ms:.3f}",
                f"{t.energy_mj:.3f}",
            )
        console.print(xt)
    pred = plan.predicted
    bt = Table(title="plan against baselines (same cost model)")
    for col in ("plan / baseline", "latency ms", "x plan", "energy mJ", "x plan", "per s", "what"):
        bt.add_column(col, justify="left" if col in ("plan / baseline", "what") else "right")
    bt.add_row(
        "plan",
        f"{pred['latency_ms']:.3f}",
        "1.00",
        f"{pred['energy_mj']:.3f}",
        "1.00",
        f"{pred['throughput_per_s']:.1f}",
        f"{len(plan.parts)} parts",
    )
    for b in plan.baselines:
        if not b.feasible:
            bt.add_row(b.name, "-", "-", "-", "-", "-", b.assignment_summary)
            continue
        lr = b.latency_ms / pred["latency_ms"] if pred["latency_ms"] else float("nan")
        er = b.energy_mj / pred["energy_mj"] if pred["energy_mj"] else float("nan")
        per_s = f"{b.throughput_per_s:.1f}" if b.throughput_per_s else "-"
        bt.add_row(
            b.name,
            f"{b.latency_ms:.3f}",
            f"{lr:.2f}",
            f"{b.energy_mj:.3f}",
            f"{er:.2f}",
            per_s,
            b.assignment_summary,
        )
    console.print(bt)
    s = plan.solver
    console.print(
        f"solver {s.name}: {s.time_s:.3f} s, {'optimal' if s.optimal else f'gap {s.gap:.1%}'} "
        f"({s.model} model){'; ' + s.detail if s.detail else ''}"
    )
