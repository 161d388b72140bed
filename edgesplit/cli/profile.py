"""``edgesplit profile``: per-node latency on every processor of a device, here or over SSH."""

from __future__ import annotations

from pathlib import Path

import click

from edgesplit.cli.common import (
    backend_option,
    console,
    device_option,
    input_shape_option,
    input_values_option,
    load_graph,
    model_inputs,
    progress_bar,
    remote_options,
    stage_limit_options,
)


@click.command("profile")
@click.argument("model", type=click.Path(dir_okay=False))
@device_option
@input_shape_option
@input_values_option
@stage_limit_options
@backend_option
@click.option("--processor", "processors", multiple=True, help="Only these processors (repeatable).")
@click.option("--runs", default=20, show_default=True, type=click.IntRange(1, 10000), help="Timed runs.")
@click.option(
    "--warmup", default=5, show_default=True, type=click.IntRange(0, 10000), help="Untimed runs first."
)
@click.option(
    "-o",
    "--output",
    type=click.Path(),
    help="Profile JSON (default MODEL.DEVICE.profile.json); "
    "with --hosts, the folder for one profile per host.",
)
@click.option(
    "--hosts",
    "fleet_file",
    type=click.Path(dir_okay=False),
    help="Profile on every host of this fleet file (YAML), in parallel.",
)
@click.option(
    "--jobs", type=click.IntRange(1, 256), help="Hosts at a time with --hosts (default: the file's)."
)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the processor/backend pairs an interrupted run saved "
    "(OUTPUT.partial) and measure only the rest.",
)
@click.option(
    "--here",
    is_flag=True,
    help="DEVICE is this machine: measure its processors here although its spec is not marked "
    "local (run on the device or server itself, e.g. a shipped server spec on the server).",
)
@remote_options("Profile on this host over SSH.")
@click.option("--top", default=10, show_default=True, help="Operators to show in the summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or table.")
def command(
    model,
    device,
    input_shapes,
    input_values,
    backends,
    processors,
    runs,
    warmup,
    output,
    fleet_file,
    jobs,
    resume,
    here,
    remote,
    ssh,
    top,
    quiet,
):
    """Measure (or predict) the latency of every node of MODEL on DEVICE.

    With --remote, MODEL is profiled on that host over SSH (the device spec, by default the
    host as detected there, describes it); with --hosts, on every host of a fleet file.
    """
    from edgesplit.device.spec import read_spec
    from edgesplit.errors import InputError
    from edgesplit.profile.run import ProfileOptions

    if remote and fleet_file:
        raise InputError("--remote and --hosts exclude each other")
    if here and (remote or fleet_file):
        raise InputError("--here measures this machine; --remote and --hosts measure others")
    # a bad device spec fails before the model is read (that can take seconds)
    spec = None if remote or fleet_file else read_spec(device).load(local=True if here else None)
    # validate locally first: a bad model never travels
    graph = load_graph(model, **model_inputs(input_shapes, input_values))
    options = ProfileOptions(backends, processors, runs, warmup)
    if fleet_file:
        return run_fleet(
            model, graph, fleet_file, ssh, output, options, jobs=jobs, resume=resume, quiet=quiet
        )
    if remote:
        prof, out, skipped = _remote(model, graph, remote, device, ssh, output, options, resume, quiet)
    else:
        prof, out, skipped = _local(graph, spec, output, options, resume, quiet)
    if not quiet:
        print_summary(graph, prof, top)
        for why in skipped:
            console.print(f"note: power rail not used: {why}")
    if prof.emulated:
        console.print(f"note: {prof.emulated}")
    if spec is not None and not any(e.source == "measured" for e in prof.entries):
        why = (
            f"{spec.name} is not marked local (on that device itself, pass --here; from here, --remote)"
            if not spec.local
            else "no processor of it could be measured on this machine"
        )
        console.print(f"note: nothing was measured, every figure is the spec's roofline: {why}")
    console.print(f"wrote {out} (energy: {prof.energy}{', EMULATED' if prof.emulated else ''})")


def _remote(model, graph, remote, device, ssh, output, options, resume, quiet):
    from edgesplit.profile.remote import RemoteOptions, profile_remote, remote_spec
    from edgesplit.profile.ssh import parse_target

    target = parse_target(remote)
    out = Path(output or f"{graph.name}.{target.host}.profile.json")
    plan: dict = {}

    def on_event(ev) -> None:
        if ev.get("event") == "plan":
            plan.update(ev)

    with progress_bar(not quiet) as update:
        prof = profile_remote(
            model,
            target,
            RemoteOptions(ssh, remote_spec(device), resume),
            output=out,
            options=options,
            input_shapes=graph.input_shapes(),
            progress=update,
            on_event=on_event,
        )
    return prof, out, plan.get("skipped", [])


def _local(graph, spec, output, options, resume, quiet):
    from edgesplit.profile.power import find_rails
    from edgesplit.profile.steps import load_partial, partial_path, profile_steps, save_partial

    out = Path(output or f"{graph.name}.{spec.name}.profile.json")
    part = partial_path(out)
    done = load_partial(part, graph.sha256, spec.name) if resume else []
    finished = list(done)

    def checkpoint(entry) -> None:
        finished.append(entry)
        save_partial(part, graph.sha256, graph.name, spec.name, graph.input_shapes(), finished)

    rails = find_rails()
    with progress_bar(not quiet) as update:
        prof = profile_steps(
            graph, spec, options, progress=update, done=done, on_entry=checkpoint, rails=rails
        )
    prof.save(out)
    part.unlink(missing_ok=True)
    return prof, out, list(rails.skipped)


def run_fleet(model, graph, fleet_file, ssh, output, options, *, jobs, resume, quiet) -> None:
    """Profile on every host of a fleet file: one progress row per host, then a status table."""
    import threading

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from edgesplit.cli.common import err_console
    from edgesplit.errors import InputError
    from edgesplit.profile.fleet import load_fleet, profile_fleet

    if not output:
        raise InputError("--hosts needs -o DIR: one profile per host goes there")
    fleet = load_fleet(fleet_file, ssh)
    lock = threading.Lock()
    with Progress(
        TextColumn("{task.description:<44}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    ) as bar:
        rows = {
            h.name: {"task": bar.add_task(f"{h.name}: queued", total=1.0), "pairs": 1, "done": 0}
            for h in fleet.hosts
        }

        def on_event(name: str, ev) -> None:
            with lock:
                row, kind = rows[name], ev.get("event")
                task = row["task"]
                if kind == "start":
                    bar.update(task, description=f"{name}: connecting")
                elif kind == "plan":
                    row["pairs"], row["done"] = max(1, len(ev["pairs"])), len(ev.get("reused", []))
                elif kind == "progress":
                    frac = ev["done"] / max(1, ev["total"])
                    if ev["label"] == "upload":
                        bar.update(task, description=f"{name}: upload")
                    else:
                        bar.update(
                            task,
                            description=f"{name}: {ev['label']}",
                            completed=min(1.0, (row["done"] + frac) / row["pairs"]),
                        )
                elif kind == "entry":
                    row["done"] += 1
                elif kind == "done":
                    res = ev["result"]
                    bar.update(
                        task,
                        description=f"{name}: {'done' if res.ok else 'FAILED'}",
                        completed=1.0 if res.ok else bar.tasks[task].completed,
                    )
                    bar.stop_task(task)

        results = profile_fleet(
            model,
            fleet,
            output,
            options=options,
            input_shapes=graph.input_shapes(),
            jobs=jobs,
            resume=resume,
            on_event=on_event,
        )
    print_fleet(graph, results)


def print_fleet(graph, results) -> None:
    """The status table of a fleet run; fails (exit 1) when any host failed."""
    from rich.table import Table

    from edgesplit.errors import EdgesplitError

    table = Table(title=f"{graph.name} on {len(results)} hosts")
    for col in ("host", "target", "status", "pairs", "reused", "energy", "time s", "profile or error"):
        table.add_column(
            col, justify="right" if col in ("pairs", "reused", "time s") else "left", overflow="fold"
        )
    for r in results:
        table.add_row(
            r.name,
            r.target,
            "ok" if r.ok else "FAILED",
            str(r.entries) if r.ok else "-",
            str(r.reused) if r.ok else "-",
            r.energy or "-",
            f"{r.elapsed_s:.1f}",
            r.output or r.error,
        )
    console.print(table)
    failed = [r.name for r in results if not r.ok]
    if failed:
        raise EdgesplitError(f"{len(failed)} of {len(results)} hosts failed: {', '.join(failed)}")


def print_summary(graph, prof, top: int) -> None:
    from rich.table import Table

    totals = Table(title=f"{graph.name} on {prof.device}: totals per processor")
    for col in (
        "processor/backend",
        "source",
        "nodes",
        "sum of nodes ms",
        "whole model ms",
        "sum/whole",
        "time s",
        "note",
    ):
        totals.add_column(
            col, justify="right" if "ms" in col or col in ("nodes", "sum/whole", "time s") else "left"
        )
    for e in prof.entries:
        ratio = f"{e.sum_ms / e.whole_model_ms:.3f}" if e.whole_model_ms and e.nodes else "-"
        whole = f"{e.whole_model_ms:.3f}" if e.whole_model_ms is not None else "-"
        count = f"{len(e.nodes)}" + (f" (+{len(e.unsupported)} n/a)" if e.unsupported else "")
        totals.add_row(
            e.key, e.source, count, f"{e.sum_ms:.3f}", whole, ratio, f"{e.elapsed_s:.1f}", e.note[:60]
        )
    console.print(totals)
    best = next((e for e in prof.entries if e.source == "measured" and e.nodes), None) or next(
        (e for e in prof.entries if e.nodes), None
    )
    if best is None:
        return
    ops = Table(title=f"top {top} operators on {best.key}")
    for col in ("node", "op", "GFLOPs", "median ms", "p90 ms", "share"):
        ops.add_column(col, justify="left" if col in ("node", "op") else "right")
    nodes = {n.name: n for n in graph.nodes}
    for name, c in sorted(best.nodes.items(), key=lambda kv: -kv[1].latency_ms)[:top]:
        share = c.latency_ms / best.sum_ms if best.sum_ms else 0.0
        ops.add_row(
            name[:40],
            nodes[name].op_type,
            f"{nodes[name].flops / 1e9:.3f}",
            f"{c.latency_ms:.3f}",
            f"{c.p90_ms:.3f}",
            f"{share:.1%}",
        )
    console.print(ops)
