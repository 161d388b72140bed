"""Precision per part: int8 QDQ and float16 parts, and their accuracy measured against fp32.

The stage sits after ``model/`` and ``device.py`` and before ``profile/`` (the int8 profiler
quantizes the model it measures):

- :mod:`~edgesplit.precision.metrics`: accuracy figures (SNR, cosine similarity, max abs error,
  top-1 agreement) and the budget a plan must meet; pure numpy, so ``optimize/`` uses it;
- :mod:`~edgesplit.precision.convert`: calibration (cached by model and data hash), int8 QDQ
  quantization with ``onnxruntime.quantization`` and float16 conversion with
  ``onnxconverter-common``, per part;
- :mod:`~edgesplit.precision.measure`: a plan's parts run in their precisions on held-out
  calibration samples, compared with the fp32 model;
- :mod:`~edgesplit.precision.record`: what a plan records of that (``Plan.accuracy``).

Calibration inputs come from :mod:`edgesplit.model.calibration_data`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgesplit.device.schema import PRECISIONS

if TYPE_CHECKING:
    from edgesplit.precision.record import AccuracyRecord

REDUCED = ("fp16", "int8")
"""The precisions that change a part's numbers (and so are checked against the budget)."""

CALIBRATION_METHODS = ("minmax", "percentile", "entropy")
"""``--calibration-method``: how int8 activation ranges are found (see
:data:`edgesplit.precision.convert.CALIBRATORS`)."""
DEFAULT_CALIBRATION_METHOD = "minmax"
RECORDED_BEFORE_METHODS = "minmax"
"""The method of a plan whose calibration record names none (made before the method was
recorded)."""

__all__ = [
    "CALIBRATION_METHODS",
    "DEFAULT_CALIBRATION_METHOD",
    "PRECISIONS",
    "RECORDED_BEFORE_METHODS",
    "REDUCED",
    "recorded_calibration",
]


def recorded_calibration(accuracy: AccuracyRecord | None) -> tuple[str | None, str]:
    """(data path or None, method) that a plan's ``accuracy`` record says it was calibrated with
    (with no record: the default data and method)."""
    from edgesplit.precision.record import CalibrationRecord

    cal = accuracy.calibration if accuracy is not None else None
    if cal is None or cal == CalibrationRecord():
        return None, DEFAULT_CALIBRATION_METHOD
    return cal.path, cal.method or RECORDED_BEFORE_METHODS
