"""``deploy``: profile, partition and compile in one step (the Python deployment API).

The module is not called ``deploy``: importing a submodule binds its name on the package, which
would hide the function ``edgesplit.deploy`` behind the module once anything imported it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from edgesplit.bundle.format import Manifest
from edgesplit.workflows.resolve import ChoiceFields

if TYPE_CHECKING:
    from edgesplit.backends.tvm.tune import TuneOptions
    from edgesplit.model.graph import ModelGraph
    from edgesplit.optimize.plan import Plan
    from edgesplit.optimize.problem import Problem
    from edgesplit.workflows.resolve import SpecLike
    from edgesplit.workflows.verify import VerifyOptions


class DeployOptions(ChoiceFields, total=False):
    """What :func:`deploy` takes besides the model, the device and the output: the fields of
    :class:`~edgesplit.workflows.resolve.Choices`, how to compile, and how to verify."""

    tune_trials: int
    """MetaSchedule trials for TVM parts in all."""
    tune: TuneOptions | None
    """MetaSchedule tuning per kernel."""
    progress: Callable[[str, int, int], None] | None
    force: bool
    """Replace ``out`` even when it holds something other than an edgesplit bundle."""
    sign_key: str | os.PathLike | None
    """An ed25519 private key file to sign the bundle with (last, the verdict included)."""
    bands: bool
    """With a server, also a plan per bandwidth band (an adaptive bundle; default True)."""
    verify: bool
    """Measure the plan against the best baselines here, alternating; ship it only where it is
    faster beyond the noise, else the best measured (default True)."""
    verify_budget_s: float
    """The most time measuring may take (compiling and loading come on top; default 30)."""
    server_url: str | None
    """An offload server for candidates with server parts, or ``"local"`` to serve them from
    this process; without one they are skipped (and listed as such)."""
    token: str | None
    """The server's bearer token."""


_DEPLOY_KEYS = DeployOptions.__optional_keys__ - ChoiceFields.__optional_keys__


def deploy(
    model: ModelGraph | str | os.PathLike,
    device: SpecLike = "host",
    out: str | os.PathLike = "bundle",
    *,
    verify_options: VerifyOptions | None = None,
    **options: Unpack[DeployOptions],
) -> Manifest:
    """Profile ``model`` on ``device`` (measured here, predicted elsewhere), partition it, compile
    the plan, and verify it by measurement against the best baselines before shipping it at ``out``.

    Args:
        model: A loaded :class:`ModelGraph` or an ONNX file (loaded with
        ``input_shapes``/``input_values``).
        verify_options: All the verification's options at once (overrides ``verify_budget_s``,
            ``server_url`` and ``token``).
        options: :class:`DeployOptions`: the fields of :class:`edgesplit.workflows.resolve.Choices`,
            as for :func:`edgesplit.partition`, and how to compile and verify.

    Returns the manifest: ``plan`` (the shipped candidate's, with predicted figures and baselines)
    and
    ``verification`` (None when not verified); open the bundle with :func:`edgesplit.load`.
    """
    from edgesplit.bundle.format import sign_bundle
    from edgesplit.bundle.signing import load_private_key
    from edgesplit.compile.build import check_output
    from edgesplit.workflows.compile import compile_bundle

    choices = {k: v for k, v in options.items() if k not in _DEPLOY_KEYS}
    tune_trials, tune = options.get("tune_trials", 0), options.get("tune")
    progress, force, bands = (
        options.get("progress"),
        options.get("force", False),
        options.get("bands", True),
    )
    sign_key = options.get("sign_key")
    key = load_private_key(sign_key) if sign_key is not None else None
    verifying = options.get("verify", True)
    budget_s, server_url, token = (
        options.get("verify_budget_s", 30.0),
        options.get("server_url"),
        options.get("token"),
    )
    vopts = (
        (verify_options or verify_options_for(budget_s, server_url, token)) if verifying else None
    )
    check_output(
        out, force, [getattr(model, "path", None) or os.fspath(model)]
    )  # before the slow steps
    problem, plan = _planned(model, device, choices, out, progress)
    if vopts is not None:
        from edgesplit.workflows.verify import verify_plan

        return verify_plan(
            problem,
            plan,
            out,
            options=vopts,
            tune_trials=tune_trials,
            tune=tune,
            progress=progress,
            force=force,
            sign_key=key,
            bands=bands,
        )
    manifest = compile_bundle(
        problem.graph,
        plan,
        out,
        device=problem.full_device,
        tune_trials=tune_trials,
        tune=tune,
        progress=progress,
        force=force,
        bands=bands,
        problem=problem,
    )
    if key is not None:
        sign_bundle(out, key)
    return manifest


def _planned(
    model: ModelGraph | str | os.PathLike,
    device: SpecLike,
    choices: dict,
    out: str | os.PathLike,
    progress: Callable[[str, int, int], None] | None,
) -> tuple[Problem, Plan]:
    """The problem and its plan. With no profile file (measured here, or given as an object), the
    profile planned with is kept beside the bundle (:func:`profile_beside`), as ``partition`` keeps
    it beside the plan: written once there is a plan, and kept should compiling or verifying
    fail."""
    from edgesplit.optimize.planner import solve_plan
    from edgesplit.workflows.resolve import Choices, resolve

    problem = resolve(model, device, Choices(**choices), progress=progress)
    keep = problem.profile_path is None
    if keep:
        problem = replace(problem, profile_path=str(profile_beside(out)))
    plan = solve_plan(problem)
    if keep:
        problem.profile.save(problem.profile_path)
    return problem, plan


def profile_beside(out: str | os.PathLike) -> Path:
    """Where ``deploy`` keeps the profile it measured for the bundle at ``out``:
    ``OUT.profile.json``
    (``bundle/`` -> ``bundle.profile.json``, ``rec.bundle`` -> ``rec.profile.json``). The bundle's
    plan names it, so ``edgesplit refit BUNDLE`` refits it without profiling again."""
    return Path(os.path.abspath(out)).with_suffix(".profile.json")


def verify_options_for(budget_s: float, server_url: str | None, token: str | None) -> VerifyOptions:
    """The options of ``--verify-budget-s`` and ``--server-url`` (``local``: serve from this
    process).

    Raises:
        PlanError: for a budget that is not positive.
    """
    from edgesplit.errors import PlanError
    from edgesplit.workflows.verify import VerifyOptions

    if not budget_s > 0:
        raise PlanError(f"--verify-budget-s must be positive, got {budget_s:g}")
    if server_url == "local":
        return VerifyOptions(budget_s=budget_s, serve="local", token=token)
    return VerifyOptions(budget_s=budget_s, server_url=server_url, token=token)
