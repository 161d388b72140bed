"""``edgesplit run``: run a bundle, print latency statistics and per-part timings."""

from __future__ import annotations

from dataclasses import dataclass

import click

from edgesplit.cli.common import console, file_option, trust_key_option
from edgesplit.cli.options import (
    Verbosity,
    field_option,
    option_group,
    verbosity_options,
    warmup_option,
)
from edgesplit.workflows.running import RunFiles


def check_token(token: str | None) -> str | None:
    """A bearer token goes into an HTTP header: visible ASCII only (no CR, LF or controls)."""
    from edgesplit.errors import InputError
    from edgesplit.runtime.oip import check_bearer_token

    try:
        return None if token is None else check_bearer_token(token, "the token")
    except InputError as e:
        raise click.BadParameter(str(e), param_hint="--token") from None


def check_prefix(prefix: str | None, flag: str) -> str:
    """A server model prefix names models: letters, digits, '_', '.' and '-' only."""
    from edgesplit.errors import InputError
    from edgesplit.runtime.oip import check_model_prefix

    try:
        return check_model_prefix(prefix or "", "the prefix")
    except InputError as e:
        raise click.BadParameter(str(e), param_hint=flag) from None


@dataclass(frozen=True)
class Timing:
    """``--repeat``, ``--warmup`` and ``--stream``."""

    repeat: int = 20
    warmup: int = 3
    stream: int = 0


@dataclass(frozen=True)
class Offload:
    """The server that runs remote parts, and how calls to it go."""

    server_url: str | None = None
    token: str | None = None
    trust_key: str | None = None
    deadline_ms: float | None = None
    adaptive: bool = False
    server_model_prefix: str = ""

    def executor_options(self) -> dict | None:
        """The executors' options: the server's URL, token and deadline (None: no server)."""
        if self.deadline_ms is not None and self.deadline_ms != self.deadline_ms:
            raise click.BadParameter(
                "nan is not a number of milliseconds", param_hint="--deadline-ms"
            )
        if self.deadline_ms is not None and not self.server_url:
            raise click.UsageError(
                "--deadline-ms applies to calls to a server: give --server URL too"
            )
        if not self.server_url:
            return None
        remote = {"url": self.server_url, "token": self.token}
        if self.server_model_prefix:
            remote["model_prefix"] = self.server_model_prefix
        if self.deadline_ms is not None:
            remote["timeout_s"] = self.deadline_ms / 1e3
        return {"remote": remote}


@dataclass(frozen=True)
class Generate:
    """``--generate`` and its prompt (a decoder bundle)."""

    generate: bool = False
    prompt_ids: tuple[int, ...] | None = None
    prompt_tokens: int | None = None
    new_tokens: int = 32
    chunk_tokens: int = 32

    def request(self, trust_key: str | None, executor_options: dict | None = None):
        """The workflow's ``GenerateRequest`` (the prompt given or ``--prompt-tokens`` random;
        with ``--server``, the server prefills it)."""
        from edgesplit.workflows.running import GenerateRequest

        if self.prompt_ids is not None and self.prompt_tokens is not None:
            raise click.UsageError("give --prompt-ids or --prompt-tokens, not both")
        if not self.generate and (self.prompt_ids is not None or self.prompt_tokens is not None):
            raise click.UsageError("--prompt-ids and --prompt-tokens apply to --generate")
        return GenerateRequest(
            prompt_ids=self.prompt_ids,
            prompt_tokens=32 if self.prompt_tokens is None else self.prompt_tokens,
            new_tokens=self.new_tokens,
            chunk_tokens=self.chunk_tokens,
            trust_key=trust_key,
            server=(executor_options or {}).get("remote"),
        )


def parse_ids(ctx, param, value: str | None) -> tuple[int, ...] | None:
    """``1,2,3`` -> (1, 2, 3)."""
    if value is None:
        return None
    try:
        ids = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(
            f"{value[:40]!r} is not comma-separated integers", param_hint="--prompt-ids"
        ) from None
    return ids


timing_options = option_group(
    Timing,
    "timing",
    field_option("--repeat", type=click.IntRange(1), help="Timed runs."),
    warmup_option,
    field_option(
        "--stream",
        type=click.IntRange(0),
        show_default=False,
        help="Also run a pipelined stream of N requests.",
    ),
)
offload_options = option_group(
    Offload,
    "offload",
    field_option("--server", "server_url", help="Offload server URL for remote parts."),
    field_option(
        "--token",
        envvar="EDGESPLIT_TOKEN",
        callback=lambda ctx, param, value: check_token(value),
        help="Bearer token for the server.",
    ),
    trust_key_option,
    field_option(
        "--deadline-ms",
        type=click.FloatRange(min=0, min_open=True, max=3.6e6),
        help="Overall deadline of each call to the server (connect, retries, send, answer); past "
        "it "
        "the part runs on its local fallback.  [default: 10000]",
    ),
    click.option(
        "--adaptive",
        is_flag=True,
        help="Switch band plans by the measured uplink (an adaptive bundle); else, per remote "
        "part, "
        "run on the server or the local fallback, whichever is measured faster.",
    ),
    field_option(
        "--server-model-prefix",
        metavar="PREFIX",
        show_default=False,
        callback=lambda ctx, param, value: check_prefix(value, "--server-model-prefix"),
        help="The server names each part's model PREFIX_<part> (a fleet's shared server: "
        "'fleet plan --bundles' gives each group's prefix).",
    ),
)
generate_options = option_group(
    Generate,
    "gen",
    click.option(
        "--generate",
        is_flag=True,
        help="Generate tokens from a decoder bundle: time to first token, decode tokens/s, "
        "per-phase and per-part time, cache copies. With --server, a server serving the same "
        "decoder prefills the prompt and the decode runs here.",
    ),
    field_option("--prompt-ids", callback=parse_ids, help="The prompt's token ids: 1,2,3."),
    field_option(
        "--prompt-tokens",
        type=click.IntRange(1),
        help="A seeded random prompt of N tokens.  [default: 32]",
    ),
    field_option("--new-tokens", type=click.IntRange(0), help="Tokens to generate."),
    field_option(
        "--chunk-tokens", type=click.IntRange(0), help="Static prefill chunk (0: one run)."
    ),
)
file_options = option_group(
    RunFiles,
    "files",
    click.option(
        "--output",
        "-o",
        type=click.Path(file_okay=False),
        help="Write the outputs as NAME.npy here.",
    ),
    file_option(
        "--trace",
        help="Write a Chrome trace (Perfetto) here.",
    ),
    click.option(
        "--trace-detail",
        is_flag=True,
        help="Also CPU time per run call and ORT kernels (layout reorders); slows runs.",
    ),
    field_option(
        "--trace-request",
        type=click.IntRange(0),
        help="Align the plan's predicted spans to this timed request (0 = the first).",
    ),
)


@click.command("run")
@click.argument("bundle", type=click.Path())
@click.option(
    "--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input (default: random)."
)
@timing_options
@offload_options
@generate_options
@file_options
@verbosity_options
def command(
    bundle: str,
    inputs: tuple[str, ...],
    timing: Timing,
    offload: Offload,
    gen: Generate,
    files: RunFiles,
    verbosity: Verbosity,
) -> None:
    """Run BUNDLE on its processors and compare with the plan's predictions."""
    from edgesplit.util import known_fields
    from edgesplit.workflows.running import BandRun, RunRequest, generate_bundle, run_bundle

    if gen.generate or gen.prompt_ids is not None or gen.prompt_tokens is not None:
        request = gen.request(offload.trust_key, offload.executor_options())
        generated = generate_bundle(bundle, request)
        if not verbosity.quiet:
            print_generation(generated)
        return

    if files.trace_request >= timing.repeat:
        raise click.BadParameter(
            f"{files.trace_request} is not below --repeat {timing.repeat}",
            param_hint="--trace-request",
        )
    request = RunRequest(
        **known_fields(RunRequest, vars(timing) | vars(offload)),
        inputs=inputs,
        executor_options=offload.executor_options(),
        files=files,
    )
    result = run_bundle(bundle, request)
    if isinstance(result, BandRun):
        if not verbosity.quiet:
            print_band_stats(result.stats, result.median_ms, result.p90_ms, result.runs)
        return
    if not verbosity.quiet:
        print_report(result)
    if files.trace:
        console.print(f"trace: {files.trace} (open in https://ui.perfetto.dev or chrome://tracing)")


def print_generation(run) -> None:
    """A generation's figures: first token, decode rate, phases, parts, cache copies, tokens."""
    import numpy as np

    st = run.stats
    steps = st.step_ms or (float("nan"),)
    chunks = ", ".join(f"{ms:.3f}" for ms in st.prefill_ms)
    console.print(
        f"prompt {st.prompt_tokens} tokens, {st.new_tokens} new; time to first token "
        f"{st.ttft_ms:.3f} ms; decode {st.decode_tokens_per_s:.1f} tokens/s"
    )
    if run.prefill_server:
        console.print(
            f"prefill: on the server {run.prefill_server}, {chunks} ms (the request, its run "
            "there and the cache's download)"
        )
    else:
        console.print(
            f"prefill: {st.prefill_chunks} chunks of {st.chunk_tokens or st.prompt_tokens} "
            f"tokens, ms per chunk: {chunks}"
        )
    console.print(
        f"decode: {len(st.step_ms)} steps, ms per step: median {np.median(steps):.3f}, "
        f"p90 {np.percentile(steps, 90):.3f}"
    )
    t = _table(
        "per-part time (run calls)",
        ("part", "processor", "runs", "total ms", "median ms", "p90 ms"),
    )
    for p in run.parts.parts:
        total = _ms(p.mean_ms * p.runs)
        t.add_row(p.name, p.processor, str(p.runs), total, _ms(p.median_ms), _ms(p.p90_ms))
    console.print(t)
    console.print(
        f"cache copies between steps: {st.cache_copies} of {st.cache_handoffs} hand-offs "
        f"({st.cache_copied_nbytes} bytes copied; cache {st.cache_nbytes} bytes at the end)"
    )
    shown = " ".join(str(t) for t in run.tokens[:16])
    console.print(f"tokens: {shown}{' ...' if len(run.tokens) > 16 else ''}")


def print_band_stats(st, median_ms: float, p90_ms: float, runs: int) -> None:
    from rich.table import Table

    t = Table(title="band plans (switched between requests)")
    for col in ("plan", "requests", "time ms", "mean ms"):
        t.add_column(col, justify="right")
    for k, (n, ms) in enumerate(zip(st.plan_requests, st.plan_ms)):
        t.add_row(
            f"{k}{' (now)' if k == st.current else ''}",
            str(n),
            f"{ms:.1f}",
            f"{ms / n:.3f}" if n else "-",
        )
    console.print(t)
    for s in st.switches:
        bw = f"{s.uplink_mbps:.3g} Mbit/s" if s.uplink_mbps is not None else "no measure"
        console.print(
            f"switch before request {s.request}: plan {s.from_plan} -> {s.to_plan} ({s.reason}, "
            f"{bw})"
        )
    up = f"{st.uplink_mbps:.3g} Mbit/s" if st.uplink_mbps is not None else "-"
    rtt = f"{st.rtt_ms:.2f} ms" if st.rtt_ms is not None else "-"
    console.print(
        f"{runs} timed requests: median {median_ms:.3f} ms, p90 {p90_ms:.3f} ms (warm-up included "
        "in the "
        f"plan times); {len(st.switches)} switches; uplink {up}, RTT {rtt}, {st.probes} probes; "
        "decision "
        f"{st.decision_us_median:.1f} us median, {st.decision_us_p99:.1f} us p99"
    )


def _table(title: str, columns: tuple[str, ...]):
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col)
    return t


def _ms(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def print_report(report) -> None:
    st = report.stats
    columns = ("part", "processor", "backend", "runs", "median ms", "p90 ms", "predicted ms")
    t = _table("per-part timings", (*columns, "measured/predicted"))
    for p in st.parts:
        ratio = f"{p.median_ms / p.predicted_ms:.2f}" if p.predicted_ms else "-"
        times = (_ms(p.median_ms), _ms(p.p90_ms), _ms(p.predicted_ms))
        t.add_row(p.name, p.processor, p.executed_by, str(p.runs), *times, ratio)
    console.print(t)
    if report.breakdown is not None:
        print_breakdown(report.breakdown)
    columns = ("mode", "runs", "median ms", "p90 ms", "predicted ms", "throughput /s")
    s = _table("end to end", (*columns, "predicted /s"))
    times = (_ms(report.median_ms), _ms(report.p90_ms), _ms(report.predicted_ms))
    s.add_row("single request", str(report.runs), *times, f"{1e3 / report.median_ms:.1f}", "-")
    if report.stream_per_s is not None:
        stream = (f"{report.stream_per_s:.1f}", _ms(report.predicted_per_s, ".1f"))
        s.add_row(f"stream of {report.stream_n}", str(report.stream_n), "-", "-", "-", *stream)
    console.print(s)
    if report.remote:
        print_remote(report.remote)
    for n in st.notes:
        console.print(f"note: {n}")


def print_remote(remote) -> None:
    """Per remote part: where it ran, failures, the link as measured, and a remote call's median
    split into the server's compute, the server's own handling (HTTP, queue) and the rest (the
    wire and this client)."""
    from rich.table import Table

    if remote:
        r = Table(title="remote parts (offload)")
        for col in (
            "part",
            "mode",
            "server runs",
            "fallback runs",
            "failures",
            "RTT ms",
            "Mbit/s",
            "call ms",
            "compute ms",
            "server other ms",
            "wire+client ms",
            "last error",
        ):
            r.add_column(col)
        for name, rs in remote.items():
            r.add_row(
                name,
                rs.mode,
                str(rs.remote_runs),
                str(rs.local_runs),
                str(rs.failures),
                f"{rs.rtt_ms:.2f}" if rs.rtt_ms is not None else "-",
                f"{rs.bandwidth_mbps:.1f}" if rs.bandwidth_mbps is not None else "-",
                *_call_split(rs),
                (rs.last_error or "")[:60],
            )
        console.print(r)
        if any(rs.url is None for rs in remote.values()):
            console.print("note: no --server given: remote parts ran on their local fallback")


def _call_split(rs) -> tuple[str, str, str, str]:
    """A remote call's median and its compute, the server's other time, and the rest (ms); only
    the call where the server sends no ``Server-Timing`` (Triton, say: its times read 0)."""
    call, server, compute = rs.remote_ms_median, rs.server_ms_median, rs.compute_ms_median
    if call is None:
        return ("-",) * 4
    if not server or compute is None:
        return f"{call:.3f}", "-", "-", "-"
    return (
        f"{call:.3f}",
        f"{compute:.3f}",
        f"{max(server - compute, 0.0):.3f}",
        f"{max(call - server, 0.0):.3f}",
    )


def print_breakdown(b) -> None:
    """Where the time went (edgesplit.runtime.breakdown.Breakdown): per part, then per request."""
    from rich.table import Table

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    kernels = any(p.engine_ms is not None for p in b.parts)
    t = Table(title="where the time goes (medians, ms)")
    cols = [
        "part",
        "processor",
        "run call",
        "predicted",
        "run/pred",
        "queue wait",
        "hand-off",
        "in+out",
    ]
    for col in cols + (["engine", "reorders", "reorder ms"] if kernels else []):
        t.add_column(col)
    for p in b.parts:
        ratio = f"{p.run_ms / p.predicted_ms:.2f}" if p.predicted_ms else "-"
        row = [p.part, p.processor, f(p.run_ms), f(p.predicted_ms), ratio, f(p.queue_wait_ms)]
        row += [f(p.handoff_ms), f(p.inputs_ms + p.outputs_ms)]
        if kernels:
            row += [f(p.engine_ms), "-" if p.reorders is None else str(p.reorders), f(p.reorder_ms)]
        t.add_row(*row)
    console.print(t)
    if b.latency_ms is None:
        return
    console.print(
        f"per request: {f(b.latency_ms)} ms median (predicted {f(b.predicted_ms)}); run calls on "
        "the "
        f"critical path {f(b.critical_run_ms)} ms; unexplained {f(b.unexplained_ms)} ms = "
        "hand-offs "
        f"{f(b.handoff_ms)} + queue waits {f(b.queue_ms)} + inputs/outputs {f(b.io_ms)} + "
        f"bookkeeping {f(b.bookkeeping_ms)} + other {f(b.other_ms)} (each a median)"
    )
    busy = ", ".join(f"{p.lane} {p.utilisation:.0%}" for p in b.processors)
    console.print(f"processors busy in run calls while the single requests ran: {busy}")
