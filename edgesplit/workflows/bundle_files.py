"""Bundles from the command line: every cheap input checked before the slow steps start.

:func:`deploy_model` is what ``edgesplit deploy`` runs and :func:`compile_plan` what ``edgesplit
compile`` runs. Both check the flags, the output folder and the device spec before the model is
read (that can take seconds) and before anything is measured or built (minutes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from edgesplit.workflows.feedback import SILENT, Feedback

if TYPE_CHECKING:
    import numpy as np

    from edgesplit.backends.tvm.tune import TuneOptions
    from edgesplit.bundle.format import Manifest
    from edgesplit.util import Progress
    from edgesplit.workflows.resolve import Choices, ModelLike, SpecLike
    from edgesplit.workflows.verify import VerifyOptions

__all__ = ["BundleRequest", "compile_plan", "deploy_model"]


@dataclass(frozen=True)
class BundleRequest:
    """Where a bundle goes and how it is built.

    Attributes:
        out: The bundle folder; an existing one must be empty or a bundle, unless ``force``.
        force: Replace ``out`` even when it holds something other than an edgesplit bundle.
        sign_key: An ed25519 private key file to sign the bundle with.
        tune_trials: MetaSchedule trials for TVM parts in all.
        tune: Per-kernel tuning (None: none beyond ``tune_trials``).
        bands: With a server, also a plan per bandwidth band (an adaptive bundle).
        verify: Measure the plan against the best baselines here and ship the measured winner
            (None: ship the plan unmeasured).
    """

    out: str | os.PathLike
    force: bool = False
    sign_key: str | os.PathLike | None = None
    tune_trials: int = 0
    tune: TuneOptions | None = None
    bands: bool = True
    verify: VerifyOptions | None = None

    def build_options(self) -> dict[str, Any]:
        """How the bundle is built, as the keywords of :func:`edgesplit.workflows.deploy.deploy`,
        :func:`edgesplit.workflows.compile.compile_bundle` and
        :func:`edgesplit.workflows.verify.verify_plan`."""
        return {
            "tune_trials": self.tune_trials,
            "tune": self.tune,
            "force": self.force,
            "sign_key": self.sign_key,
            "bands": self.bands,
        }


def deploy_model(
    model: ModelLike,
    device: SpecLike,
    choices: Choices,
    request: BundleRequest,
    *,
    feedback: Feedback = SILENT,
) -> Manifest:
    """Profile, partition and compile ``model`` for ``device`` (:func:`edgesplit.deploy`), after
    checking the choices, the output folder and the device spec; ``feedback`` is told the progress
    and what loading the model changed.

    Raises:
        PlanError, DeviceSpecError, ModelLoadError, ProfileError, CompileError: as
            :func:`edgesplit.deploy`.
    """
    from edgesplit.compile.build import check_output
    from edgesplit.workflows.deploy import deploy
    from edgesplit.workflows.resolve import check_choices, load_graph, load_spec

    check_choices(choices)  # bad flags fail before the model is read
    check_output(request.out, request.force, [os.fspath(model)])  # and an output kept from harm
    spec = load_spec(device)  # and a bad device spec (reading a model can take seconds)
    graph = load_graph(model, choices.input_shapes, choices.input_values, on_note=feedback.on_note)
    given: dict[str, Any] = {f.name: getattr(choices, f.name) for f in fields(choices)}
    return deploy(
        graph,
        spec,
        request.out,
        progress=feedback.progress,
        **request.build_options(),
        verify=request.verify is not None,
        verify_options=request.verify,
        **given,
    )


def compile_plan(
    model: ModelLike,
    plan: str | os.PathLike,
    request: BundleRequest,
    *,
    device: SpecLike | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Compile ``plan`` for ``model`` into a bundle; with ``request.verify``, load the plan's
    problem again from what it records and verify it first (as ``deploy`` does).

    ``device`` overrides the spec the plan records.

    Raises:
        PlanError, DeviceSpecError, ModelLoadError, CompileError: naming the file at fault.
    """
    if request.verify is None:
        from edgesplit.workflows.compile import compile_bundle

        return compile_bundle(
            model,
            plan,
            request.out,
            device=device,
            input_shapes=input_shapes,
            input_values=input_values,
            progress=progress,
            **request.build_options(),
        )
    return _verified(model, plan, request, device, (input_shapes, input_values), progress)


def _verified(model, plan_path, request: BundleRequest, device, inputs, progress) -> Manifest:
    from edgesplit.compile.build import check_output
    from edgesplit.workflows.resolve import as_plan, load_graph, load_spec, problem_from_plan
    from edgesplit.workflows.verify import verify_plan

    check_output(request.out, request.force, [os.fspath(model), os.fspath(plan_path)])
    plan = as_plan(plan_path)
    shapes, values = inputs
    graph = load_graph(model, shapes or plan.input_shapes or None, values)
    problem = problem_from_plan(plan, graph)
    if device is not None:
        problem = replace(problem, device=load_spec(device))
    return verify_plan(
        problem,
        plan,
        request.out,
        options=request.verify,
        progress=progress,
        **request.build_options(),
    )
