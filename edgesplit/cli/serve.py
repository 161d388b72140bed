"""``edgesplit serve``: serve a bundle's server parts over the Open Inference Protocol v2."""

from __future__ import annotations

import click

from edgesplit.cli.common import FiniteFloat


@click.command("serve")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. Anything but loopback exposes the models: use --token.",
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port (0: any free port; the one chosen is printed).",
)
@click.option(
    "--token",
    envvar="EDGESPLIT_TOKEN",
    metavar="T",
    help="Require 'Authorization: Bearer T' on every call but health checks (or set EDGESPLIT_TOKEN).",
)
@click.option(
    "--max-request-mb",
    default=64.0,
    show_default=True,
    type=FiniteFloat(minimum=0, open_min=True),
    help="Largest request body accepted (413 above).",
)
@click.option(
    "--trust-key",
    type=click.Path(dir_okay=False),
    metavar="PUBKEY",
    help="Serve the bundle only if its manifest is signed by this ed25519 public key.",
)
@click.option(
    "--max-inflight-mb",
    default=256.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Request bytes held at once across all requests (503 + Retry-After above; JSON counts 16x).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=None,
    help="Open connections at most; at the cap the oldest idle one is closed, or 503 if all are busy "
    "[default: the file-descriptor limit less 192, at most 1024].",
)
@click.option(
    "--max-queue",
    default=128,
    show_default=True,
    type=click.IntRange(min=0),
    help="Requests waiting for a compute thread at most (503 + Retry-After above).",
)
@click.option(
    "--header-timeout-s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Time for a request's headers to arrive: the first request's from the connection's start, "
    "a kept-alive connection's next one's from its first byte (408 and close after).",
)
@click.option(
    "--body-timeout-s",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Time to receive a request body, and to send an answer (408 / close after).",
)
@click.option(
    "--idle-timeout-s",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Idle keep-alive connections are closed after this.",
)
@click.option("--all-parts", is_flag=True, help="Serve every part of the bundle, not only the server parts.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Requests computed at once (default: the CPU count).",
)
@click.option(
    "--intra-op-threads",
    type=click.IntRange(min=1),
    default=None,
    help="ONNX Runtime threads per request (default: the part's planned threads, else all cores).",
)
@click.option(
    "--max-batch",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Requests for one part stacked and run as one batch at most (1: no batching). Parts whose "
    "first dimension cannot be made free are served unbatched (a note says why).",
)
@click.option(
    "--max-queue-delay-ms",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0, max=60_000),
    help="How long a batch that is not full may wait for more requests (from its oldest one).",
)
def command(
    bundle: str,
    host: str,
    port: int,
    token: str | None,
    max_request_mb: float,
    trust_key: str | None,
    max_inflight_mb: float,
    max_connections: int | None,
    max_queue: int,
    header_timeout_s: float,
    body_timeout_s: float,
    idle_timeout_s: float,
    all_parts: bool,
    threads: int | None,
    intra_op_threads: int | None,
    max_batch: int,
    max_queue_delay_ms: float,
) -> None:
    """Serve BUNDLE's server parts (model name = part name) until SIGTERM or Ctrl-C.

    Speaks KServe v2 / Triton REST with the binary tensor extension, so tritonclient.http
    and 'edgesplit run --server URL' work against it. In-flight requests finish on shutdown.
    Every limit below answers with a JSON error: 408 (too slow), 413 (too large), 503 with
    Retry-After (busy: connections, bytes in flight, compute queue).
    """
    import logging
    import math

    from edgesplit.cli.common import err_console
    from edgesplit.serve.server import MB, OffloadServer, ServeOptions

    for flag, value in (("--max-request-mb", max_request_mb), ("--max-inflight-mb", max_inflight_mb)):
        if not math.isfinite(value):
            raise click.BadParameter(f"{value} is not a finite number", param_hint=flag)
    logging.basicConfig(level=logging.WARNING, format="edgesplit serve: %(message)s")
    options = ServeOptions(
        host=host,
        port=port,
        token=token or None,
        max_request_nbytes=int(max_request_mb * MB),
        max_inflight_nbytes=int(max_inflight_mb * MB),
        max_connections=max_connections,
        max_queue=max_queue,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        idle_timeout_s=idle_timeout_s,
        all_parts=all_parts,
        compute_threads=threads,
        intra_op_threads=intra_op_threads,
        trust_key=trust_key,
        max_batch=max_batch,
        max_queue_delay_ms=max_queue_delay_ms,
    )
    server = OffloadServer(bundle, options)
    for note in server.notes:
        err_console.print(f"note: {note}")

    def ready(bound_host: str, bound_port: int) -> None:
        names = ", ".join(server.models)
        auth = "bearer token required" if token else "no auth"
        click.echo(
            f"edgesplit serve: listening on http://{bound_host}:{bound_port} "
            f"({len(server.models)} model(s): {names}; {auth})",
            err=True,
        )

    server.serve(on_ready=ready)
