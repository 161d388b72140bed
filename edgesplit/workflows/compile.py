"""``compile`` as the public API takes it: a model and a plan as paths or objects, resolved here
into the loaded graph, the plan and the device spec that
:func:`edgesplit.compile.build.build_bundle`
compiles, with the band plans of a plan that offloads over a link."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from edgesplit.bundle.format import Manifest
from edgesplit.compile.build import CompileOptions, build_bundle, check_output, check_plan_fits
from edgesplit.errors import EdgesplitError
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.bands import BandAnalysis, band_analysis
from edgesplit.optimize.plan import Plan
from edgesplit.util import sha256_file
from edgesplit.workflows.resolve import (
    SpecLike,
    as_plan,
    load_graph,
    plan_device,
    problem_from_plan,
)

if TYPE_CHECKING:
    import numpy as np

    from edgesplit.optimize.problem import Problem


class BundleOptions(CompileOptions, total=False):
    """:class:`CompileOptions`, and how a model given as a path is loaded."""

    input_shapes: Mapping[str, Sequence[int]] | None
    """Shapes to load a ``model`` path with (default the plan's)."""
    input_values: Mapping[str, np.ndarray] | None
    """Sample values to load a ``model`` path with (a plan records no sample values)."""


def compile_bundle(
    model: str | os.PathLike | ModelGraph,
    plan: Plan | str | os.PathLike,
    out: str | os.PathLike,
    *,
    device: SpecLike | None = None,
    problem: Problem | None = None,
    bands: bool = True,
    **options: Unpack[BundleOptions],
) -> Manifest:
    """Extract, check and compile every part of ``plan``; write the bundle at ``out`` atomically.

    Args:
        model: The model (a path, or a loaded graph).
        plan: The plan (a path to plan.json is read once, here).
        device: The device spec (with its server's processors, or they are added); default the
            spec file the plan was made with, else the spec its name finds.
        problem: The plan's problem, when the caller has it (else loaded again from the plan for
            the band plans).
        bands: With a server, also a plan per bandwidth band (an adaptive bundle); plans whose
            problem cannot be loaded again get a note.
        options: :class:`BundleOptions` (tuning, ``force``, ``sign_key``, the accuracy budget,
            ``input_shapes`` and ``input_values``).

    Raises:
        PlanError: the plan was made for another model, or names unknown processors or nodes.
        CompileError: see :func:`edgesplit.compile.build.build_bundle`.
    """
    source = "plan" if isinstance(plan, Plan) else os.fspath(plan)
    model_path = "" if isinstance(model, ModelGraph) else os.fspath(model)
    check_output(out, options.get("force", False), [model_path, "" if source == "plan" else source])
    plan = as_plan(plan)
    graph = _graph_for(
        model, plan, options.pop("input_shapes", None), options.pop("input_values", None)
    )
    spec = plan_device(plan, device)
    analysis = _bands(plan, problem) if bands else None
    return build_bundle(graph, plan, spec, out, source=source, bands=analysis, **options)


def _graph_for(
    model: str | os.PathLike | ModelGraph,
    plan: Plan,
    input_shapes: Mapping[str, Sequence[int]] | None,
    input_values: Mapping[str, np.ndarray] | None,
) -> ModelGraph:
    """The model, loaded with the plan's input shapes unless told others, checked to be the plan's,
    and rewritten for the plan's split operators."""
    if not isinstance(model, ModelGraph) and Path(model).is_file():
        check_plan_fits(
            plan, os.fspath(model), sha256_file(model)
        )  # before the plan's shapes apply
    graph = load_graph(model, input_shapes or plan.input_shapes or None, input_values)
    check_plan_fits(plan, graph.path, graph.sha256)
    if plan.splits and any(n.name not in plan.assignment for n in graph.nodes):  # not rewritten yet
        from edgesplit.optimize.split import for_plan

        graph = for_plan(graph, plan.splits)[0]
    return graph


def _bands(plan: Plan, problem: Problem | None) -> BandAnalysis:
    """The plan's band analysis, its problem loaded again from the plan when not given (a plan whose
    profile is no longer on file gets none: it cannot be priced again without measuring)."""
    if problem is None and plan.server and plan.link:
        if not plan.profile_path or not Path(plan.profile_path).is_file():
            reason = "the plan's profile is not on file (give the problem to price it)"
            return band_analysis(plan, None, reason=reason)
        try:
            problem = problem_from_plan(plan)
        except EdgesplitError as e:
            return band_analysis(
                plan, None, reason=f"the plan's problem cannot be loaded again ({e})"
            )
    return band_analysis(plan, problem)
