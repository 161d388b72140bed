"""``edgesplit partition``: choose which processor runs each node, and write the plan."""

from __future__ import annotations

from dataclasses import dataclass

import click

from edgesplit.cli.common import (
    console,
    feedback,
    file_option,
    print_note,
)
from edgesplit.cli.options import (
    ModelInputs,
    PlanOptions,
    Verbosity,
    field_option,
    model_device_options,
    option_group,
    plan_options,
    verbosity_options,
)


@dataclass(frozen=True)
class PlanOutput:
    """``-o PLAN``, ``--onnx-out`` and ``--plot``."""

    output: str = "plan.json"
    onnx_out: str | None = None
    plot_path: str | None = None


plan_output_options = option_group(
    PlanOutput,
    "files",
    file_option("--plot", "plot_path", help="Write a Gantt chart (PNG)."),
    file_option("-o", "--output", default="plan.json", show_default=True),
    file_option(
        "--onnx-out",
        help="Annotated model copy (default: beside the plan, PLAN.onnx).",
    ),
)


@dataclass(frozen=True)
class PhaseChoice:
    """``--generate``: a plan per phase of a decoder for P prompt and N new tokens."""

    generate: bool = False
    prompt_tokens: int = 64
    new_tokens: int = 32
    server_url: str | None = None
    server_model: str = "p0"
    token: str | None = None


phase_options = option_group(
    PhaseChoice,
    "phases",
    field_option(
        "--generate",
        is_flag=True,
        help="MODEL is a decoder: choose a prefill plan and a decode plan (writes JSON to -o).",
    ),
    field_option("--prompt-tokens", type=click.IntRange(1), help="With --generate: P."),
    field_option("--new-tokens", type=click.IntRange(1), help="With --generate: N."),
    field_option(
        "--server-url",
        help="With --generate: a running `edgesplit serve` of the decoder that may prefill the "
        "prompt instead; its prefill is measured from here and priced on --link, "
        "--bandwidth-mbps and --rtt-ms.",
    ),
    field_option(
        "--server-model",
        show_default=True,
        help="With --server-url: the decoder's name on the server (a one-part bundle's part).",
    ),
    field_option("--token", envvar="EDGESPLIT_TOKEN", help="Bearer token for --server-url."),
)


@click.command("partition")
@model_device_options
@plan_options(
    "A profile JSON of MODEL on DEVICE (default: measure what is local, predict the rest)."
)
@plan_output_options
@phase_options
@verbosity_options
def command(
    model: str,
    device: str,
    inputs: ModelInputs,
    plan: PlanOptions,
    files: PlanOutput,
    phases: PhaseChoice,
    verbosity: Verbosity,
) -> None:
    """Split MODEL across the processors of DEVICE (and a server) for an objective.

    Without --profile, the processors of DEVICE that are on this machine are measured and the
    profile is written beside the plan (PLAN.profile.json). With --generate, MODEL is a decoder
    and each phase (prefill, decode) gets a processor: the whole decoder is measured per phase on
    each local processor and the plan with the least time to first token + decode is written.
    """
    from edgesplit.workflows.plan_files import PlanFiles, write_plan

    if phases.generate:
        _partition_phases(model, device, plan, phases, files.output, verbosity.quiet)
        return
    if phases.server_url is not None:
        from edgesplit.errors import PlanError

        raise PlanError("--server-url is for --generate (a plan's server parts take --server)")

    where = PlanFiles(files.output, files.onnx_out, files.plot_path)
    # profiling here and measuring accuracy can take minutes on a big model
    with feedback(not verbosity.quiet) as told:
        written = write_plan(model, device, plan.choices(inputs), where, feedback=told)
    if not verbosity.quiet:
        print_plan(written.plan)
    plot = f" and {written.plot_path}" if written.plot_path else ""
    console.print(f"wrote {written.plan_path} and {written.onnx_path}{plot}")


def _partition_phases(
    model: str, device: str, plan: PlanOptions, phases: PhaseChoice, output: str, quiet: bool
) -> None:
    """``--generate``: a plan per phase, a server's prefill among the candidates with
    ``--server-url``."""
    from edgesplit.errors import PlanError
    from edgesplit.workflows.phase_plan import PhaseRequest, PrefillServer, write_phase_plan

    flags = plan.server_link
    link_flags = (flags.link, flags.bandwidth_mbps, flags.rtt_ms)
    if flags.server is not None or flags.server_profile is not None:
        raise PlanError(
            "--generate takes --server-url (a running serve of the decoder), not --server"
        )
    if phases.server_url is None and any(v is not None for v in link_flags):
        raise PlanError("with --generate, --link, --bandwidth-mbps and --rtt-ms need --server-url")
    server = None
    if phases.server_url is not None:
        from edgesplit.device.spec import network_link

        link = network_link(flags.link, bandwidth_mbps=flags.bandwidth_mbps, rtt_ms=flags.rtt_ms)
        server = PrefillServer(phases.server_url, phases.server_model, phases.token, link)
    request = PhaseRequest(phases.prompt_tokens, phases.new_tokens, server=server)
    note = None if quiet else print_note
    phase_plan = write_phase_plan(model, device, request, output, note).plan
    if not quiet:
        print_phase_plan(phase_plan)
    console.print(f"wrote {output}")


def print_plan(plan) -> None:
    from rich.table import Table

    parts = Table(
        title=f"{plan.model_name} on {plan.device}"
        + (f" + {plan.server}" if plan.server else "")
        + f" ({plan.objective})"
    )
    cols = (
        "part",
        "processor",
        "backend",
        "precision",
        "nodes",
        "stage",
        "start ms",
        "end ms",
        "predicted ms",
        "mJ",
    )
    for col in cols:
        parts.add_column(col, justify="right" if col not in cols[:4] else "left")
    for p in plan.parts:
        parts.add_row(
            p.name,
            p.processor,
            p.backend,
            p.precision,
            str(len(p.nodes)),
            str(p.stage),
            f"{p.start_ms:.3f}",
            f"{p.end_ms:.3f}",
            f"{p.latency_ms:.3f}",
            f"{p.energy_mj:.3f}",
        )
    console.print(parts)
    line = cost_sources_line(plan)
    if line:
        console.print(line, soft_wrap=True)
    _print_transfers(plan)
    _print_baselines(plan)
    for line in accuracy_lines(plan):
        console.print(line, soft_wrap=True)
    s = plan.solver
    console.print(
        f"solver {s.name}: {s.time_s:.3f} s, {'optimal' if s.optimal else f'gap {s.gap:.1%}'} "
        f"({s.model} model){'; ' + s.detail if s.detail else ''}"
    )


def cost_sources_line(plan) -> str:
    """Where the plan's figures come from, per processor/backend pair, grouped by source; the
    server's measured pairs are named as measured on the server (``--server-profile``)."""
    by_source: dict[str, list[str]] = {}
    for key, source in sorted(plan.cost_sources.items()):
        remote = plan.server is not None and key.startswith(f"{plan.server}.")
        label = "measured on the server" if remote and source == "measured" else source
        by_source.setdefault(
            "predicted by the spec's roofline" if source == "predicted" else label, []
        ).append(key)
    return (
        "costs: " + "; ".join(f"{k} {', '.join(v)}" for k, v in by_source.items())
        if by_source
        else ""
    )


def _print_transfers(plan) -> None:
    from rich.table import Table

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


def _print_baselines(plan) -> None:
    from rich.table import Table

    pred = plan.predicted
    bt = Table(title="plan against baselines (same cost model)")
    for col in (
        "plan / baseline",
        "latency ms",
        "x plan",
        "energy mJ",
        "x plan",
        "per s",
        "accuracy",
        "what",
    ):
        bt.add_column(
            col, justify="left" if col in ("plan / baseline", "accuracy", "what") else "right"
        )
    bt.add_row(
        "plan",
        f"{pred.latency_ms:.3f}",
        "1.00",
        f"{pred.energy_mj:.3f}",
        "1.00",
        f"{pred.throughput_per_s:.1f}",
        accuracy_cell(plan),
        f"{len(plan.parts)} parts",
    )
    for b in plan.baselines:
        if not b.feasible:
            bt.add_row(b.name, "-", "-", "-", "-", "-", "-", b.assignment_summary)
            continue
        lr = b.latency_ms / pred.latency_ms if pred.latency_ms else float("nan")
        er = b.energy_mj / pred.energy_mj if pred.energy_mj else float("nan")
        per_s = f"{b.throughput_per_s:.1f}" if b.throughput_per_s else "-"
        bt.add_row(
            b.name,
            f"{b.latency_ms:.3f}",
            f"{lr:.2f}",
            f"{b.energy_mj:.3f}",
            f"{er:.2f}",
            per_s,
            "-",
            b.assignment_summary,
        )
    console.print(bt)


def accuracy_cell(plan) -> str:
    """The plan's measured accuracy against fp32, short (``fp32`` when it has no reduced part)."""
    if plan.accuracy is None or plan.accuracy.measured is None:
        return "fp32 (exact)"
    acc = plan.accuracy.measured
    top1 = f", top-1 {acc.top1_agreement:.1%}" if acc.top1_agreement is not None else ""
    return f"SNR {acc.snr_db:.1f} dB{top1} (measured)"


def accuracy_lines(plan) -> list[str]:
    """The accuracy check: budget, what it was measured on, each reduced part alone, what was
    dropped."""
    from edgesplit.precision.record import CalibrationRecord

    a = plan.accuracy
    if a is None or a.measured is None:
        return []
    cal = a.calibration or CalibrationRecord()
    budget = a.budget.to_json() if a.budget is not None else {}
    lines = [
        f"accuracy against fp32: {a.measured.summary()} on "
        f"{'?' if cal.held_out_samples is None else cal.held_out_samples} held-out samples of "
        f"{cal.source or '?'} data; "
        f"budget {', '.join(f'{k}={v}' for k, v in budget.items()) or 'none'}: "
        + ("met" if a.meets else "missed")
    ]
    if cal.warning:
        lines.append(f"warning: {cal.warning}")
    for name, fig in (a.parts or {}).items():
        lines.append(f"  part {name} alone: {fig.summary()}")
    for step in a.dropped or ():
        lines.append(
            f"  dropped {step.precision} part {step.part} ({step.nodes} nodes on "
            f"{step.processor}): "
            f"{step.why}"
        )
    return lines


def print_phase_plan(plan) -> None:
    """The candidates of a phase plan, least total first (at most 12), and the choice."""
    from rich.table import Table

    pr = plan.profile
    t = Table(
        title=f"{pr.model_name} on {pr.device}: {pr.prompt_tokens} prompt tokens, "
        f"{pr.new_tokens} new (predicted)"
    )
    for col in ("prefill", "chunk", "decode", "TTFT ms", "switch ms", "decode tok/s", "total ms"):
        t.add_column(col, justify="left" if col in ("prefill", "decode") else "right")
    t.add_column("mJ/token", justify="right")
    for c in plan.candidates[:12]:
        t.add_row(
            c.prefill_processor, str(c.chunk_tokens), c.decode_processor, f"{c.ttft_ms:.3f}",
            f"{c.switch_ms:.3f}", f"{c.decode_tokens_per_s:.1f}", f"{c.total_ms:.3f}",
            f"{c.energy_per_token_mj:.3f}",
        )  # fmt: skip
    console.print(t)
    best = plan.best_single()
    console.print(
        f"chosen: {plan.chosen.label}, {plan.chosen.total_ms:.3f} ms predicted; best single "
        f"processor: {best.label}, {best.total_ms:.3f} ms",
        soft_wrap=True,
    )
