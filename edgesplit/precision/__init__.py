"""Precision per part: int8 QDQ and float16 parts, and their accuracy measured against fp32.

The stage sits after ``model/`` and ``device.py`` and before ``profile/`` (the int8 profiler
quantizes the model it measures):

- :mod:`~edgesplit.precision.metrics`: accuracy figures (SNR, cosine similarity, max abs error,
  top-1 agreement) and the budget a plan must meet; pure numpy, so ``optimize/`` uses it;
- :mod:`~edgesplit.precision.convert`: calibration (cached by model and data hash), int8 QDQ
  quantization with ``onnxruntime.quantization`` and float16 conversion with
  ``onnxconverter-common``, per part;
- :mod:`~edgesplit.precision.measure`: a plan's parts run in their precisions on held-out
  calibration samples, compared with the fp32 model.

Calibration inputs come from :mod:`edgesplit.model.calibration_data`.
"""

from edgesplit.device_schema import PRECISIONS

REDUCED = ("fp16", "int8")
"""The precisions that change a part's numbers (and so are checked against the budget)."""

__all__ = ["PRECISIONS", "REDUCED"]
