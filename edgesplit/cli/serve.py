"""``edgesplit serve``: serve a bundle's server parts over the Open Inference Protocol v2."""

from __future__ import annotations

from dataclasses import dataclass

import click

from edgesplit.cli.common import FiniteFloat, file_option
from edgesplit.cli.options import (
    Batching,
    Verbosity,
    batching_options,
    field_option,
    option_group,
    verbosity_options,
)


@dataclass(frozen=True)
class ServeAccess:
    """Where the server listens, who may call it, and which bundles it serves."""

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_request_mb: float = 64.0
    trust_key: str | None = None


@dataclass(frozen=True)
class ServeLimits:
    """How much the server holds at once, and how long it waits."""

    max_inflight_mb: float = 256.0
    max_connections: int | None = None
    max_queue: int = 128
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 30.0
    max_cache_tokens: int | None = None


@dataclass(frozen=True)
class ServeCompute:
    """Which parts are served, and the threads that compute them."""

    all_parts: bool = False
    threads: int | None = None
    intra_op_threads: int | None = None
    model_prefix: str = ""


_seconds = click.FloatRange(min=0, min_open=True)
access_options = option_group(
    ServeAccess,
    "access",
    field_option(
        "--host",
        help="Address to bind. Anything but loopback exposes the models: use --token.",
    ),
    field_option(
        "--port",
        type=click.IntRange(0, 65535),
        help="TCP port (0: any free port; the one chosen is printed).",
    ),
    click.option(
        "--token",
        envvar="EDGESPLIT_TOKEN",
        metavar="T",
        help="Require 'Authorization: Bearer T' on every call but health checks (or set "
        "EDGESPLIT_TOKEN).",
    ),
    field_option(
        "--max-request-mb",
        type=FiniteFloat(minimum=0, open_min=True),
        help="Largest request body accepted (413 above).",
    ),
    file_option(
        "--trust-key",
        metavar="PUBKEY",
        help="Serve the bundle only if its manifest is signed by this ed25519 public key.",
    ),
)
limit_options = option_group(
    ServeLimits,
    "limits",
    field_option(
        "--max-inflight-mb",
        type=click.FloatRange(min=0, min_open=True),
        help="Request bytes held at once across all requests (503 + Retry-After above; JSON counts "
        "16x).",
    ),
    field_option(
        "--max-connections",
        type=click.IntRange(min=1),
        help="Open connections at most; at the cap the oldest idle one is closed, or 503 if all "
        "are busy [default: the file-descriptor limit less 192, at most 1024].",
    ),
    field_option(
        "--max-queue",
        type=click.IntRange(min=0),
        help="Requests waiting for a compute thread at most (503 + Retry-After above).",
    ),
    field_option(
        "--header-timeout-s",
        type=_seconds,
        help="Time for a request's headers to arrive: the first request's from the connection's "
        "start, a kept-alive connection's next one's from its first byte (408 and close after).",
    ),
    field_option(
        "--body-timeout-s",
        type=_seconds,
        help="Time to receive a request body, and to send an answer (408 / close after).",
    ),
    field_option(
        "--idle-timeout-s", type=_seconds, help="Idle keep-alive connections are closed after this."
    ),
    field_option(
        "--max-cache-tokens",
        type=click.IntRange(min=1),
        help="A decoder part's KV cache per request, batch x positions, at most (400 above) "
        "[default: the model's positions].",
    ),
)
compute_options = option_group(
    ServeCompute,
    "compute",
    click.option(
        "--all-parts",
        is_flag=True,
        help="Serve every part of the bundle, not only the server parts.",
    ),
    field_option(
        "--threads",
        type=click.IntRange(min=1),
        help="Requests computed at once (default: the CPU count).",
    ),
    field_option(
        "--intra-op-threads",
        type=click.IntRange(min=1),
        help="ONNX Runtime threads per request (default: the part's planned threads, else all "
        "cores).",
    ),
    field_option(
        "--model-prefix",
        metavar="PREFIX",
        show_default=False,
        help="Name each part's model PREFIX_<part> (as 'fleet plan --bundles' names a shared "
        "server's models); devices call it with 'run --server-model-prefix PREFIX'.",
    ),
)


@click.command("serve")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@access_options
@limit_options
@compute_options
@batching_options(
    "Requests for one part stacked and run as one batch at most (1: no batching). Parts whose "
    "first dimension cannot be made free are served unbatched (a note says why).",
    "How long a batch that is not full may wait for more requests (from its oldest one).",
)
@verbosity_options
def command(
    bundle: str,
    access: ServeAccess,
    limits: ServeLimits,
    compute: ServeCompute,
    batching: Batching,
    verbosity: Verbosity,
) -> None:
    """Serve BUNDLE's server parts (model name = part name, or --model-prefix's) until SIGTERM.

    Speaks KServe v2 / Triton REST with the binary tensor extension, so tritonclient.http
    and 'edgesplit run --server URL' work against it. In-flight requests finish on shutdown.
    Every limit below answers with a JSON error: 408 (too slow), 413 (too large), 503 with
    Retry-After (busy: connections, bytes in flight, compute queue).
    """
    import logging

    from edgesplit.cli.common import print_note
    from edgesplit.workflows.serving import serve_bundle

    options = serve_options(access, limits, compute, batching)
    logging.basicConfig(level=logging.WARNING, format="edgesplit serve: %(message)s")

    def ready(host: str, port: int, models: list[str]) -> None:
        auth = "bearer token required" if access.token else "no auth"
        click.echo(
            f"edgesplit serve: listening on http://{host}:{port} "
            f"({len(models)} model(s): {', '.join(models)}; {auth})",
            err=True,
        )

    serve_bundle(bundle, options, on_note=print_note, on_ready=ready)


def serve_options(
    access: ServeAccess, limits: ServeLimits, compute: ServeCompute, batching: Batching
):
    """The :class:`~edgesplit.serve.server.ServeOptions` of the command line.

    Raises:
        click.BadParameter: for a size in MB that is not finite (exit 2).
    """
    import math

    from edgesplit.serve.server import MB, ServeOptions
    from edgesplit.util import known_fields

    for flag, value in (
        ("--max-request-mb", access.max_request_mb),
        ("--max-inflight-mb", limits.max_inflight_mb),
    ):
        if not math.isfinite(value):
            raise click.BadParameter(f"{value} is not a finite number", param_hint=flag)
    same = known_fields(ServeOptions, vars(access) | vars(limits) | vars(compute) | vars(batching))
    same["token"] = access.token or None
    return ServeOptions(
        **same,
        max_request_nbytes=int(access.max_request_mb * MB),
        max_inflight_nbytes=int(limits.max_inflight_mb * MB),
        compute_threads=compute.threads,
    )
