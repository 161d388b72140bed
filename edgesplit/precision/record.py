"""A plan's accuracy record (:attr:`edgesplit.optimize.Plan.accuracy`), typed, and its JSON.

:func:`edgesplit.optimize.accuracy.fit_budget` writes it for a plan with reduced-precision parts:
the budget, the figures of the plan and of each such part alone, the parts dropped to meet the
budget, and the calibration data. Pure (``optimize/`` imports it).

Every field may be absent from a file: the JSON holds the keys that were recorded, and a record
read and written again is the same JSON. The figures are checked by
:func:`edgesplit.precision.metrics.check_record` before they are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from edgesplit.precision.metrics import Accuracy, AccuracyBudget, check_figures, check_record
from edgesplit.util import check_fields, known_fields, present_fields, short


@dataclass(frozen=True, kw_only=True)
class CalibrationRecord:
    """The data a plan's accuracy was measured on, and how int8 ranges were calibrated on it.

    Attributes:
        source, origin, sha256: What the data is, where it came from, and its hash
            (:class:`edgesplit.model.calibration_data.CalibrationData`).
        calibration_samples, held_out_samples: Samples calibrated on, and measured on.
        warning: Why figures measured on this data are weak (None: no warning).
        path: The data file or folder (None: the data was made up, not read).
        method: ``minmax``, ``percentile`` or ``entropy`` (None in plans made before the method
            was recorded: see :func:`edgesplit.precision.recorded_calibration`).
    """

    source: str | None = None
    origin: str | None = None
    sha256: str | None = None
    calibration_samples: int | None = None
    held_out_samples: int | None = None
    warning: str | None = None
    path: str | None = None
    method: str | None = None

    def to_json(self) -> dict[str, Any]:
        return present_fields(self)


@dataclass(frozen=True, kw_only=True)
class DroppedPart:
    """A reduced-precision part dropped to fp32 on the way to the budget.

    Attributes:
        part, processor, precision: The part dropped, where it ran, and in what.
        nodes: How many nodes it had.
        plan: The figures of the whole plan that missed the budget.
        alone: The part's figures with the rest of the model in fp32.
        why: How the plan missed the budget.
    """

    part: str
    processor: str
    precision: str
    nodes: int
    plan: Accuracy
    alone: Accuracy
    why: str

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {"plan": self.plan.to_json(), "alone": self.alone.to_json()}


@dataclass(frozen=True, kw_only=True)
class AccuracyRecord:
    """The measured accuracy of a plan with reduced-precision parts against fp32.

    Attributes:
        budget: What the plan was held to.
        meets: Whether its figures meet the budget.
        measured: The figures of the whole plan.
        parts: Each reduced-precision part's figures alone (the rest in fp32), by part name.
        dropped: The parts dropped to fp32 on the way, in order.
        calibration: The data it was measured on.
    """

    budget: AccuracyBudget | None = None
    meets: bool | None = None
    measured: Accuracy | None = None
    parts: Mapping[str, Accuracy] | None = None
    dropped: tuple[DroppedPart, ...] | None = None
    calibration: CalibrationRecord | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in present_fields(self).items():
            if key == "parts":
                out[key] = {name: fig.to_json() for name, fig in value.items()}
            elif key == "dropped":
                out[key] = [step.to_json() for step in value]
            else:
                out[key] = value if key == "meets" else value.to_json()
        return out

    @staticmethod
    def from_json(d: Any, source: str, error: type[Exception]) -> AccuracyRecord:
        """Read a record, checking it first (``source`` names it in errors, as
        ``plan.json: accuracy``).

        Raises:
            error: naming ``source`` and the key at fault, in one line.
        """
        check_record(d, source, error)
        kw: dict[str, Any] = {"meets": d.get("meets")}
        if "budget" in d:
            kw["budget"] = AccuracyBudget.from_json(d["budget"])
        if "measured" in d:
            kw["measured"] = Accuracy.from_json(d["measured"])
        if "parts" in d:
            kw["parts"] = {name: Accuracy.from_json(fig) for name, fig in d["parts"].items()}
        if "dropped" in d:
            where = f"{source}.dropped"
            kw["dropped"] = tuple(
                _dropped(s, f"{where}[{i}]", error) for i, s in enumerate(d["dropped"])
            )
        if "calibration" in d:
            cal = d["calibration"]
            kw["calibration"] = CalibrationRecord(**known_fields(CalibrationRecord, cal))
            check_fields(kw["calibration"], f"{source}.calibration", error)
        record = AccuracyRecord(**kw)
        check_fields(record, source, error)
        return record


def _dropped(step: Any, where: str, error: type[Exception]) -> DroppedPart:
    if not isinstance(step, Mapping):
        raise error(f"{where}: expected an object, got {short(step, 40)}")
    try:
        kw = known_fields(DroppedPart, step)
    except KeyError as e:
        raise error(f"{where}: missing key {e}") from e
    for key in ("plan", "alone"):
        check_figures(Accuracy, kw[key], f"{where}.{key}", error)
        kw[key] = Accuracy.from_json(kw[key])
    out = DroppedPart(**kw)
    check_fields(out, where, error)
    return out
