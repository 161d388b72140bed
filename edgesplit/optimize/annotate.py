"""Write the plan into a copy of the model: every node carries its processor and part.

Netron shows node ``metadata_props``, so the assignment can be read off the graph. The copy is the
simplified model the plan was made from (its node names are the plan's), with the plan's split
operators written in where it has some.
"""

from __future__ import annotations

import os

import onnx

from edgesplit.errors import PlanError
from edgesplit.optimize.plan import Plan
from edgesplit.util import atomic_write_bytes

PROCESSOR_KEY = "edgesplit.processor"
PART_KEY = "edgesplit.part"
BACKEND_KEY = "edgesplit.backend"


def annotate_model(model: onnx.ModelProto, plan: Plan) -> onnx.ModelProto:
    """A copy of ``model`` whose nodes carry ``edgesplit.processor``, ``.backend`` and ``.part``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    part_of = {n: p.name for p in plan.parts for n in p.nodes}
    missing = [n.name for n in out.graph.node if n.name not in plan.assignment]
    if missing:
        raise PlanError(
            f"the plan does not cover {len(missing)} nodes of the model ({', '.join(missing[:3])} "
            "...)"
        )
    for node in out.graph.node:
        keep = [e for e in node.metadata_props if not e.key.startswith("edgesplit.")]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
        where = plan.assignment[node.name]
        for key, value in (
            (PROCESSOR_KEY, where["processor"]),
            (BACKEND_KEY, where["backend"]),
            (PART_KEY, part_of[node.name]),
        ):
            node.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    meta = {e.key: e for e in out.metadata_props}
    for key, value in (
        ("edgesplit.device.spec", plan.device),
        ("edgesplit.objective", plan.objective),
    ):
        if key in meta:
            meta[key].value = value
        else:
            out.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    return out


def write_annotated(model: onnx.ModelProto, plan: Plan, path: str | os.PathLike) -> None:
    """Save the annotated copy atomically."""
    atomic_write_bytes(path, annotate_model(model, plan).SerializeToString())
