"""``partition`` to files: a model's plan written beside what it was made from.

:func:`write_plan` is what ``edgesplit partition`` runs: the plan as :func:`edgesplit.partition`
makes it, written as JSON with an annotated copy of the model, the profile it measured (when it
measured one) and, if asked, a Gantt chart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgesplit.workflows.feedback import SILENT, Feedback

if TYPE_CHECKING:
    from edgesplit.optimize.plan import Plan
    from edgesplit.workflows.resolve import Choices, ModelLike, SpecLike

__all__ = ["PlanFiles", "WrittenPlan", "annotated_path", "write_plan"]


@dataclass(frozen=True)
class PlanFiles:
    """Where a plan and what goes with it are written.

    Attributes:
        plan: The plan's JSON file; a profile measured for it goes beside it
        (``PLAN.profile.json``).
        onnx: The annotated copy of the model (default: beside the plan, ``PLAN.onnx``).
        plot: A Gantt chart of the plan (PNG), or None for none.
    """

    plan: str | os.PathLike = "plan.json"
    onnx: str | os.PathLike | None = None
    plot: str | os.PathLike | None = None


@dataclass(frozen=True)
class WrittenPlan:
    """The plan, and the files :func:`write_plan` wrote (``profile``: None when one was given)."""

    plan: Plan
    plan_path: Path
    onnx_path: Path
    plot_path: Path | None
    profile_path: Path | None


def annotated_path(plan: str | os.PathLike, onnx: str | os.PathLike | None, model: str) -> Path:
    """Where the annotated model goes: ``onnx``, else beside the plan; never over the model.

    Raises:
        PlanError: when ``onnx`` names the model itself.
    """
    from edgesplit.errors import PlanError

    out = Path(plan)
    onnx_path = Path(onnx) if onnx else out.with_suffix(".onnx")
    if onnx_path.resolve() == Path(model).resolve():
        if onnx:
            raise PlanError(f"--onnx-out {onnx} would overwrite the model")
        onnx_path = out.with_suffix(".annotated.onnx")  # never overwrite the input model
    return onnx_path


def write_plan(
    model: ModelLike,
    device: SpecLike,
    choices: Choices,
    files: PlanFiles,
    *,
    feedback: Feedback = SILENT,
) -> WrittenPlan:
    """Plan ``model`` on ``device`` and write the plan and its companions to ``files``.

    Everything cheap is checked before the model is read (the choices, the output paths, the
    device spec); ``feedback`` is told what loading the model changed, before anything long starts.
    Without a profile in ``choices``, the device's local processors are measured and the profile
    is written beside the plan once there is a plan to go with it.

    Raises:
        PlanError, DeviceSpecError, ModelLoadError, ProfileError: as :func:`edgesplit.partition`.
    """
    from edgesplit.optimize.planner import solve_plan
    from edgesplit.workflows.resolve import check_choices, load_graph, load_spec, resolve

    out = Path(files.plan)
    onnx_path = annotated_path(out, files.onnx, getattr(model, "path", None) or os.fspath(model))
    check_choices(choices)  # bad flags fail before the model is read
    spec = load_spec(device)  # and so does a bad device spec (reading a model can take seconds)
    graph = load_graph(model, choices.input_shapes, choices.input_values, on_note=feedback.on_note)
    problem = resolve(graph, spec, choices, progress=feedback.progress)
    measured = problem.profile_path is None
    if measured:  # measured here: kept beside the plan, for explain and compile
        problem = replace(problem, profile_path=str(out.with_suffix(".profile.json")))
    plan = solve_plan(problem)
    if measured:  # written only once there is a plan to go with it
        problem.profile.save(problem.profile_path)
    plan.save(out)
    _write_annotated(problem.graph, plan, onnx_path)
    if files.plot:
        from edgesplit.optimize.plot import gantt

        gantt(plan, files.plot)
    profile = Path(problem.profile_path) if measured else None
    plot = Path(files.plot) if files.plot else None
    return WrittenPlan(plan, out, onnx_path, plot, profile)


def _write_annotated(graph, plan: Plan, path: Path) -> None:
    """The model with each node's part written in; a plan's nodes are those of the model with
    its splits written in."""
    from edgesplit.optimize.annotate import write_annotated

    if plan.splits:
        from edgesplit.optimize.split import for_plan

        graph = for_plan(graph, plan.splits)[0]
    write_annotated(graph.model, plan, path)
