"""``deploy``: profile, partition and compile in one step (the Python deployment API).

The module is not called ``deploy``: importing a submodule binds its name on the package, which
would hide the function ``edgesplit.deploy`` behind the module once anything imported it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgesplit.compile.bundle import Manifest

if TYPE_CHECKING:
    from edgesplit.model.graph import ModelGraph


def deploy(
    model: ModelGraph | str | os.PathLike,
    device: str | os.PathLike = "host",
    out: str | os.PathLike = "bundle",
    *,
    tune_trials: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
    force: bool = False,
    sign_key: str | os.PathLike | None = None,
    bands: bool = True,
    **choices,
) -> Manifest:
    """Profile ``model`` on ``device`` (measured here, predicted elsewhere), partition it and
    compile the plan into a bundle at ``out``.

    Args:
        model: A loaded :class:`ModelGraph` (the ``deploy`` command loads first, to print what
            loading changed) or the path of an ONNX file, loaded with ``input_shapes`` and
            ``input_values``.
        choices: The fields of :class:`edgesplit.pipeline.Choices`, as for
            :func:`edgesplit.partition`: ``objective``, ``slo_ms``, ``profile``, ``server``,
            ``link``, ``bandwidth_mbps``, ``rtt_ms``, ``pins``, ``input_shapes``,
            ``input_values``, ``profiling``.
        tune_trials: MetaSchedule trials for TVM parts.
        force: Replace ``out`` even when it holds something other than an edgesplit bundle.
        sign_key: An ed25519 private key file to sign the bundle with (the bundle is signed last).
        bands: With a server, also a plan per bandwidth band (an adaptive bundle).

    The bundle's manifest carries the plan (``Manifest.plan``), with the predicted figures and the
    baselines. Returns the manifest; open the bundle with :func:`edgesplit.load`.
    """
    from edgesplit.compile.api import check_output, compile_bundle
    from edgesplit.compile.bundle import sign_bundle
    from edgesplit.compile.signing import load_private_key
    from edgesplit.optimize.api import solve_plan
    from edgesplit.pipeline import Choices, resolve

    key = load_private_key(sign_key) if sign_key is not None else None
    check_output(out, force, [getattr(model, "path", None) or os.fspath(model)])  # before the slow steps
    problem = resolve(model, device, Choices(**choices), progress=progress)
    plan = solve_plan(problem)
    manifest = compile_bundle(
        problem.graph,
        plan,
        out,
        device=problem.full_device,
        tune_trials=tune_trials,
        progress=progress,
        force=force,
        bands=bands,
        problem=problem,
    )
    if key is not None:
        sign_bundle(out, key)
    return manifest
