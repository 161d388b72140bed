"""A bundle's accuracy against fp32, measured by running it (the hook for ``deploy``'s
verification).

The bundle runs through the real runtime (:func:`edgesplit.load`: its int8 and fp16 artifacts on
their executors) on the held-out samples of the calibration data its plan was measured on, and
its outputs are compared with the fp32 model's on the same samples.
"""

from __future__ import annotations

import os
from typing import Any

from edgesplit.bundle.format import Manifest, open_bundle
from edgesplit.model.graph import ModelGraph
from edgesplit.precision import recorded_calibration
from edgesplit.precision.measure import PlanMeasurer
from edgesplit.precision.metrics import Accuracy, AccuracyBudget, compare
from edgesplit.runtime.session import load


def bundle_accuracy(
    bundle: str | os.PathLike,
    model: ModelGraph | str | os.PathLike | None = None,
    *,
    calibration_data: str | os.PathLike | None = None,
    **load_options: Any,
) -> Accuracy:
    """Run the bundle on held-out calibration samples and compare its outputs with fp32's.

    Args:
        model: The fp32 model (default the plan's ``model_path``, with the plan's input shapes).
        calibration_data: Default the data the plan's accuracy was measured on.
        load_options: For :func:`edgesplit.load` (executor options, ``trust_key``, ...).
    """
    from edgesplit.model.load import load_model

    with load(bundle, **load_options) as session:
        manifest: Manifest = session.manifest
        plan = manifest.plan
        recorded, method = recorded_calibration(plan.accuracy)
        graph = (
            model
            if isinstance(model, ModelGraph)
            else load_model(
                os.fspath(model if model is not None else plan.model_path),
                plan.input_shapes or None,
            )
        )
        data = calibration_data if calibration_data is not None else recorded
        measurer = PlanMeasurer(graph, data, method)
        got = [session.run(dict(s)) for s in measurer.data.held_out]
    outputs = [{k: g[k] for k in graph.outputs} for g in got]
    return compare(measurer.reference, outputs)


def bundle_meets(
    bundle: str | os.PathLike, budget: AccuracyBudget | None = None, **kwargs
) -> list[str]:
    """Why the bundle misses ``budget`` (default: its plan's), measured; empty when it meets it."""
    if budget is None:
        plan = open_bundle(
            bundle, verify=False, trust_key=kwargs.get("trust_key")
        ).plan  # load verifies
        recorded = plan.accuracy.budget if plan.accuracy is not None else None
        budget = recorded or AccuracyBudget()
    return budget.misses(bundle_accuracy(bundle, **kwargs))
