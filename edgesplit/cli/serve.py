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
def command(
    bundle: str,
    host: str,
    port: int,
    token: str | None,
    max_request_mb: float,
    trust_key: str | None,
    all_parts: bool,
    threads: int | None,
    intra_op_threads: int | None,
) -> None:
    """Serve BUNDLE's server parts (model name = part name) until SIGTERM or Ctrl-C.

    Speaks KServe v2 / Triton REST with the binary tensor extension, so tritonclient.http
    and 'edgesplit run --server URL' work against it. In-flight requests finish on shutdown.
    """
    import logging

    from edgesplit.cli.common import err_console
    from edgesplit.runtime.server import MB, OffloadServer, ServeOptions

    logging.basicConfig(level=logging.WARNING, format="edgesplit serve: %(message)s")
    options = ServeOptions(
        host=host,
        port=port,
        token=token or None,
        max_request_nbytes=int(max_request_mb * MB),
        all_parts=all_parts,
        compute_threads=threads,
        intra_op_threads=intra_op_threads,
        trust_key=trust_key,
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
