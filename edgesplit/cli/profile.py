"""``edgesplit profile``: per-node latency on every processor of a device, here or over SSH."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from edgesplit.cli.common import (
    backend_option,
    console,
    err_console,
    feedback,
    file_option,
    print_note,
)
from edgesplit.cli.options import (
    ModelInputs,
    RemoteFlags,
    Verbosity,
    field_option,
    model_device_options,
    option_group,
    remote_options,
    verbosity_options,
)
from edgesplit.profile.options import ProfileOptions

if TYPE_CHECKING:
    from edgesplit.workflows.profiling import ProfiledModel, ProfileRequest


@dataclass(frozen=True)
class ProfileTarget:
    """Where the profile goes, and which machines are measured."""

    output: str | None = None
    fleet_file: str | None = None
    jobs: int | None = None
    resume: bool = False
    here: bool = False


measure_options = option_group(
    ProfileOptions,
    "measure",
    backend_option,
    click.option(
        "--processor", "processors", multiple=True, help="Only these processors (repeatable)."
    ),
    field_option("--runs", type=click.IntRange(1, 10000), help="Timed runs."),
    field_option("--warmup", type=click.IntRange(0, 10000), help="Untimed runs first."),
)
target_options = option_group(
    ProfileTarget,
    "target",
    click.option(
        "-o",
        "--output",
        type=click.Path(),
        help="Profile JSON (default MODEL.DEVICE.profile.json); "
        "with --hosts, the folder for one profile per host.",
    ),
    file_option(
        "--hosts",
        "fleet_file",
        help="Profile on every host of this fleet file (YAML), in parallel.",
    ),
    click.option(
        "--jobs",
        type=click.IntRange(1, 256),
        help="Hosts at a time with --hosts (default: the file's).",
    ),
    click.option(
        "--resume",
        is_flag=True,
        help="Keep the processor/backend pairs an interrupted run saved "
        "(OUTPUT.partial) and measure only the rest.",
    ),
    click.option(
        "--here",
        is_flag=True,
        help="DEVICE is this machine: measure its processors here although its spec is not marked "
        "local (run on the device or server itself, e.g. a shipped server spec on the server).",
    ),
)


@click.command("profile")
@model_device_options
@measure_options
@target_options
@remote_options("Profile on this host over SSH.")
@click.option("--top", default=10, show_default=True, help="Operators to show in the summary.")
@verbosity_options
def command(
    model: str,
    device: str,
    inputs: ModelInputs,
    measure: ProfileOptions,
    target: ProfileTarget,
    remote: RemoteFlags,
    top: int,
    verbosity: Verbosity,
) -> None:
    """Measure (or predict) the latency of every node of MODEL on DEVICE.

    With --remote, MODEL is profiled on that host over SSH (the device spec, by default the
    host as detected there, describes it); with --hosts, on every host of a fleet file.
    """
    from edgesplit.workflows.profiling import profile_to_file

    request = profile_request(inputs, measure, target, remote)
    if target.fleet_file:
        return run_fleet(model, target.fleet_file, request, jobs=target.jobs, quiet=verbosity.quiet)
    with feedback(not verbosity.quiet) as told:
        done = profile_to_file(model, device, request, feedback=told)
    print_profiled(done, top, verbosity.quiet)


def profile_request(
    inputs: ModelInputs, measure: ProfileOptions, target: ProfileTarget, remote: RemoteFlags
) -> ProfileRequest:
    """The :class:`~edgesplit.workflows.profiling.ProfileRequest` of the command line."""
    from edgesplit.workflows.profiling import ProfileRequest

    return ProfileRequest(
        output=target.output,
        options=measure,
        resume=target.resume,
        here=target.here,
        remote=remote.remote,
        ssh=remote.ssh(),
        **inputs.parsed(),
    )


def print_profiled(done: ProfiledModel, top: int, quiet: bool) -> None:
    """The summary tables (unless ``quiet``), the notes, and the file written."""
    prof, spec = done.profile, done.spec
    if not quiet:
        print_summary(done.graph, prof, top)
        for why in done.rails_skipped:
            console.print(f"note: power rail not used: {why}")
    if prof.emulated:
        console.print(f"note: {prof.emulated}")
    if spec is not None and not any(e.source == "measured" for e in prof.entries):
        why = (
            f"{spec.name} is not marked local (on that device itself, pass --here; from here, "
            "--remote)"
            if not spec.local
            else "no processor of it could be measured on this machine"
        )
        console.print(f"note: nothing was measured, every figure is the spec's roofline: {why}")
    energy = f"{prof.energy}{', EMULATED' if prof.emulated else ''}"
    console.print(f"wrote {done.path} (energy: {energy})")


def run_fleet(model: str, fleet_file: str, request: ProfileRequest, *, jobs, quiet: bool) -> None:
    """Profile on every host of a fleet file: one progress row per host, then a status table."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from edgesplit.workflows.profiling import profile_hosts

    with Progress(
        TextColumn("{task.description:<44}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    ) as bar:
        rows = _FleetRows(bar)
        graph, results = profile_hosts(
            model, fleet_file, request, jobs=jobs, on_event=rows.on_event, on_note=print_note
        )
    print_fleet(graph, results)


class _FleetRows:
    """One progress row per host of a fleet, moved by the hosts' events."""

    def __init__(self, bar):
        import threading

        self.bar, self.rows, self.lock = bar, {}, threading.Lock()

    def on_event(self, name: str, ev) -> None:
        with self.lock:
            kind, bar = ev.get("event"), self.bar
            if kind == "queued":
                task = bar.add_task(f"{name}: queued", total=1.0)
                self.rows[name] = {"task": task, "pairs": 1, "done": 0}
                return
            row = self.rows[name]
            task = row["task"]
            if kind == "start":
                bar.update(task, description=f"{name}: connecting")
            elif kind == "plan":
                row["pairs"], row["done"] = max(1, len(ev["pairs"])), len(ev.get("reused", []))
            elif kind == "progress" and ev["label"] == "upload":
                bar.update(task, description=f"{name}: upload")
            elif kind == "progress":
                frac = ev["done"] / max(1, ev["total"])
                done = min(1.0, (row["done"] + frac) / row["pairs"])
                bar.update(task, description=f"{name}: {ev['label']}", completed=done)
            elif kind == "entry":
                row["done"] += 1
            elif kind == "done":
                ok = ev["result"].ok
                completed = 1.0 if ok else bar.tasks[task].completed
                bar.update(
                    task, description=f"{name}: {'done' if ok else 'FAILED'}", completed=completed
                )
                bar.stop_task(task)


def print_fleet(graph, results) -> None:
    """The status table of a fleet run; fails (exit 1) when any host failed."""
    from rich.table import Table

    from edgesplit.errors import EdgesplitError

    table = Table(title=f"{graph.name} on {len(results)} hosts")
    for col in (
        "host",
        "target",
        "status",
        "pairs",
        "reused",
        "energy",
        "time s",
        "profile or error",
    ):
        table.add_column(
            col,
            justify="right" if col in ("pairs", "reused", "time s") else "left",
            overflow="fold",
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
            col,
            justify="right" if "ms" in col or col in ("nodes", "sum/whole", "time s") else "left",
        )
    for e in prof.entries:
        ratio = f"{e.sum_ms / e.whole_model_ms:.3f}" if e.whole_model_ms and e.nodes else "-"
        whole = f"{e.whole_model_ms:.3f}" if e.whole_model_ms is not None else "-"
        count = f"{len(e.nodes)}" + (f" (+{len(e.unsupported)} n/a)" if e.unsupported else "")
        totals.add_row(
            e.key,
            e.source,
            count,
            f"{e.sum_ms:.3f}",
            whole,
            ratio,
            f"{e.elapsed_s:.1f}",
            e.note[:60],
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
