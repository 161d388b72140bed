"""``serve``: a bundle's server parts served over the Open Inference Protocol v2 until stopped."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgesplit.serve.server import ServeOptions

__all__ = ["serve_bundle"]


def serve_bundle(
    bundle: str | os.PathLike,
    options: ServeOptions,
    *,
    on_note: Callable[[str], None] | None = None,
    on_ready: Callable[[str, int, list[str]], None] | None = None,
) -> None:
    """Serve ``bundle`` with ``options`` until SIGTERM or Ctrl-C (in-flight requests finish).

    ``on_note`` is told why a part is served as it is (unbatched, say) before the socket opens;
    ``on_ready`` gets the address bound (the port chosen, for port 0) and the models served.

    Raises:
        BundleError: for a bundle that cannot be loaded or verified.
    """
    from edgesplit.serve.server import OffloadServer

    server = OffloadServer(bundle, options)
    for note in server.notes if on_note is not None else ():
        on_note(note)

    def ready(host: str, port: int) -> None:
        if on_ready is not None:
            on_ready(host, port, list(server.models))

    server.serve(on_ready=ready)
