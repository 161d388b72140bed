"""compile's check of what ships in int8 or fp16: the artifacts, measured against fp32 by the
measure
of the plan's accuracy budget.

An fp32 part is checked against the whole model to float rounding (1e-3,
:func:`edgesplit.compile.split.check_parts`). A quantized part can never meet that: int8 QDQ moves
a part's outputs by a few percent of their range by design. So the bundle's reduced-precision
parts are checked the way the planner measured them: the plan's parts run in order, each from the
file that ships (the ``.int8.onnx`` or ``.fp16.onnx`` artifact; fp32 parts from their ONNX file), on
the held-out samples of the plan's calibration data, and the model's outputs are compared with the
fp32 model's (:func:`edgesplit.precision.metrics.compare`: SNR dB, cosine, max abs error, top-1
agreement). The bundle must meet the plan's budget. Each reduced part is also run alone on the fp32
model's tensors at its inputs, and the SNR at its own outputs is reported, so that a failure names
the part that broke (a wrong scale, a stale calibration).

Artifacts run here with ONNX Runtime's CPU provider, whatever provider they name (QNN's HTP and
NNAPI take the same QDQ models): the numbers checked are the model's, not the accelerator's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgesplit.compile.split import probe_session
from edgesplit.device.cpu import ort_session_options
from edgesplit.errors import CompileError
from edgesplit.model.calibration_data import calibration_set
from edgesplit.model.graph import ModelGraph
from edgesplit.optimize.plan import Part, Plan
from edgesplit.precision.metrics import DEFAULT_BUDGET, Accuracy, AccuracyBudget, compare

if TYPE_CHECKING:
    from edgesplit.bundle.format import PartArtifact


@dataclass(frozen=True)
class PrecisionCheck:
    """What compile measured of one plan's reduced-precision parts.

    Attributes:
        budget: The budget held to (the plan's, unless compile was given one).
        budget_from: ``plan``, ``given`` or ``default`` (the plan records none).
        measured: The bundle's outputs against fp32 on the held-out samples.
        parts_snr_db: Each reduced part alone (fp32 inputs), SNR at its own outputs, worst output.
        data: What the samples are (source and count).
    """

    budget: AccuracyBudget
    budget_from: str
    measured: Accuracy
    parts_snr_db: Mapping[str, float]
    data: str

    @property
    def misses(self) -> list[str]:
        return self.budget.misses(self.measured)

    def worst_part(self) -> str:
        return min(self.parts_snr_db, key=lambda k: (self.parts_snr_db[k], k))

    def note(self, label: str = "") -> str:
        """One line for the manifest's notes."""
        per = ", ".join(f"{k} {v:.1f} dB" for k, v in self.parts_snr_db.items())
        verdict = "met" if not self.misses else "missed (" + "; ".join(self.misses) + ")"
        return (
            f"precision check{label}: int8/fp16 parts against fp32 on {self.data}: "
            f"{self.measured.summary()}; budget ({self.budget_from}) {self.budget.summary()}: "
            f"{verdict}; "
            f"SNR at each part's outputs: {per}"
        )


def plan_budget(plan: Plan, given: AccuracyBudget | None) -> tuple[AccuracyBudget, str]:
    """The budget a plan's bundle is held to, and where it came from."""
    if given is not None:
        return given, "given"
    recorded = plan.accuracy.budget if plan.accuracy is not None else None
    if recorded:
        return recorded, "plan"
    return DEFAULT_BUDGET, "default"


def _session(path: Path):
    import onnxruntime as ort

    so = ort_session_options(None, None, spin=False)  # run one after another (precision.measure)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _snr(ref: Sequence[Mapping[str, np.ndarray]], got: Sequence[Mapping[str, np.ndarray]]) -> float:
    return compare(ref, got).snr_db


def check_precision(
    graph: ModelGraph,
    parts: Sequence[Part],
    artifacts: Mapping[str, PartArtifact],
    bundle_dir: Path,
    budget: AccuracyBudget,
    budget_from: str,
    calibration_data: str | None = None,
) -> PrecisionCheck | None:
    """Measure one plan's bundle parts (``parts`` in the plan's order, ``artifacts`` by part name,
    files under ``bundle_dir``); None when every part is fp32 (checked to rounding already)."""
    reduced = [p for p in parts if p.precision != "fp32"]
    if not reduced:
        return None
    data = calibration_set(graph, calibration_data)
    names = sorted({t for p in parts for t in (*p.inputs, *p.outputs)} | set(graph.outputs))
    probe = probe_session(graph, names)
    wanted = [o.name for o in probe.get_outputs()]
    sessions = {}
    for p in parts:
        art = artifacts[p.name]
        sessions[p.name] = _session(
            bundle_dir / (art.file if p.precision != "fp32" else art.onnx_file)
        )
    ref_out, got_out = [], []
    alone: dict[str, tuple[list, list]] = {p.name: ([], []) for p in reduced}
    for sample in data.held_out:
        ref = {**sample, **dict(zip(wanted, probe.run(wanted, dict(sample))))}
        values = dict(sample)
        for p in parts:
            got = sessions[p.name].run(list(p.outputs), {t: values[t] for t in p.inputs})
            values.update(zip(p.outputs, got))
        for p in reduced:
            own = sessions[p.name].run(list(p.outputs), {t: ref[t] for t in p.inputs})
            alone[p.name][0].append({t: ref[t] for t in p.outputs})
            alone[p.name][1].append(dict(zip(p.outputs, own)))
        ref_out.append({t: ref[t] for t in graph.outputs})
        got_out.append({t: values[t] for t in graph.outputs})
    return PrecisionCheck(
        budget=budget,
        budget_from=budget_from,
        measured=compare(ref_out, got_out),
        parts_snr_db={k: round(_snr(r, g), 2) for k, (r, g) in alone.items()},
        data=f"{len(data.held_out)} held-out {data.source} samples",
    )


def require(check: PrecisionCheck | None, label: str = "") -> None:
    """Refuse a bundle whose reduced-precision parts miss the budget, naming the worst part.

    Raises:
        CompileError: with the measured figures, the budget and the part with the lowest SNR.
    """
    if check is None or not check.misses:
        return
    worst = check.worst_part()
    raise CompileError(
        f"the int8/fp16 parts{label} miss the accuracy budget against fp32 on {check.data}: "
        f"{'; '.join(check.misses)} (budget from the {check.budget_from}); the worst part is "
        f"{worst}, "
        f"SNR {check.parts_snr_db[worst]:.1f} dB at its own outputs"
    )
