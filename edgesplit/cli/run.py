"""``edgesplit run``: run a bundle, print latency statistics and per-part timings."""

from __future__ import annotations

import click

from edgesplit.cli.common import console


@click.command("run")
@click.argument("bundle", type=click.Path())
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input (default: random).")
@click.option("--repeat", default=20, show_default=True, type=click.IntRange(1), help="Timed runs.")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(0), help="Untimed runs first.")
@click.option(
    "--stream", default=0, type=click.IntRange(0), help="Also run a pipelined stream of N requests."
)
@click.option("--server", "server_url", default=None, help="Offload server URL for remote parts.")
@click.option("--token", default=None, envvar="EDGESPLIT_TOKEN", help="Bearer token for the server.")
@click.option(
    "--adaptive",
    is_flag=True,
    help="Per remote part, run on the server or the local fallback, whichever is measured faster.",
)
@click.option("--output", "-o", type=click.Path(file_okay=False), help="Write the outputs as NAME.npy here.")
def command(bundle, inputs, repeat, warmup, stream, server_url, token, adaptive, output):
    """Run BUNDLE on its processors and compare with the plan's predictions."""
    from edgesplit.runtime.api import benchmark, load, read_inputs

    options = {"remote": {"url": server_url, "token": token}} if server_url else None
    with load(bundle, executor_options=options, adaptive=adaptive) as sess:
        feeds = read_inputs(sess, inputs)
        report = benchmark(sess, feeds, repeat=repeat, warmup=warmup, stream=stream)
        if output:
            report.save_outputs(output)
    print_report(report)


def print_report(report) -> None:
    from rich.table import Table

    st = report.stats
    t = Table(title="per-part timings")
    for col in (
        "part",
        "processor",
        "backend",
        "runs",
        "median ms",
        "p90 ms",
        "predicted ms",
        "measured/predicted",
    ):
        t.add_column(col)
    for p in st.parts:
        ratio = f"{p.median_ms / p.predicted_ms:.2f}" if p.predicted_ms else "-"
        t.add_row(
            p.name,
            p.processor,
            p.executed_by,
            str(p.runs),
            f"{p.median_ms:.3f}",
            f"{p.p90_ms:.3f}",
            f"{p.predicted_ms:.3f}" if p.predicted_ms is not None else "-",
            ratio,
        )
    console.print(t)
    s = Table(title="end to end")
    for col in ("mode", "runs", "median ms", "p90 ms", "predicted ms", "throughput /s", "predicted /s"):
        s.add_column(col)
    pred = f"{report.predicted_ms:.3f}" if report.predicted_ms is not None else "-"
    s.add_row(
        "single request",
        str(report.runs),
        f"{report.median_ms:.3f}",
        f"{report.p90_ms:.3f}",
        pred,
        f"{1e3 / report.median_ms:.1f}",
        "-",
    )
    if report.stream_per_s is not None:
        pred_s = f"{report.predicted_per_s:.1f}" if report.predicted_per_s is not None else "-"
        s.add_row(
            f"stream of {report.stream_n}",
            str(report.stream_n),
            "-",
            "-",
            "-",
            f"{report.stream_per_s:.1f}",
            pred_s,
        )
    console.print(s)
    if report.remote:
        r = Table(title="remote parts (offload)")
        for col in (
            "part",
            "mode",
            "server runs",
            "fallback runs",
            "failures",
            "RTT ms",
            "Mbit/s",
            "last error",
        ):
            r.add_column(col)
        for name, rs in report.remote.items():
            r.add_row(
                name,
                rs.mode,
                str(rs.remote_runs),
                str(rs.local_runs),
                str(rs.failures),
                f"{rs.rtt_ms:.2f}" if rs.rtt_ms is not None else "-",
                f"{rs.bandwidth_mbps:.1f}" if rs.bandwidth_mbps is not None else "-",
                (rs.last_error or "")[:60],
            )
        console.print(r)
        if any(rs.url is None for rs in report.remote.values()):
            console.print("note: no --server given: remote parts ran on their local fallback")
    for n in st.notes:
        console.print(f"note: {n}")
