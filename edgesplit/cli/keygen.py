"""``edgesplit keygen``: an ed25519 key pair to sign bundles with (``compile/deploy
--sign-key``)."""

from __future__ import annotations

import click

from edgesplit.cli.common import console
from edgesplit.cli.options import Verbosity, verbosity_options


@click.command("keygen")
@click.argument("key", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Replace KEY and KEY.pub if they exist.")
@verbosity_options
def command(key: str, force: bool, verbosity: Verbosity) -> None:
    """Write a new ed25519 private key to KEY (PEM, mode 0600) and its public key to KEY.pub.

    Sign with 'compile/deploy --sign-key KEY'; load only signed bundles with
    'run/serve --trust-key KEY.pub' or edgesplit.load(bundle, trust_key="KEY.pub").
    """
    from edgesplit.bundle.signing import generate_key

    private, public, kid = generate_key(key, force=force)
    console.print(f"wrote {private} (private: keep it secret) and {public} (public); key id {kid}")
