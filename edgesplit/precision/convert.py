"""Parts in reduced precision: int8 QDQ with ``onnxruntime.quantization``, float16 with
``onnxconverter-common``; calibration cached by model and data hash.

int8 is static QDQ quantization (the format ONNX Runtime's CPU kernels and the QNN and NNAPI
execution providers take): per-channel int8 weights, uint8 activations whose ranges come from a
MinMax calibration of the *whole* model on the calibration samples, so that every part of one
model shares the same scales at its boundaries. The calibration (ORT's ``TensorsData``) is cached
as JSON under ``$EDGESPLIT_CACHE/calibration/`` (default ``~/.cache/edgesplit``), keyed by the
sha256 of the model as loaded and of the samples; ORT writes the file atomically.

A part keeps float32 inputs and outputs in every precision: an int8 part quantizes what enters it
and dequantizes what leaves it (QuantizeLinear / DequantizeLinear at its edges), an fp16 part casts.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import onnx

from edgesplit.cache import cache_folder
from edgesplit.errors import CompileError
from edgesplit.model.calibration_data import CalibrationSet
from edgesplit.model.graph import ModelGraph
from edgesplit.precision import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD

Converter = Callable[[onnx.ModelProto, Path | None, Sequence[str]], onnx.ModelProto]


def cache_dir() -> Path:
    return cache_folder("calibration")


def model_sha256(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime.quantization logs advice on the root logger for every call, and its histogram
    calibrators print their progress (which would land in a command's output)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


class _Reader:
    """ORT's CalibrationDataReader protocol over a list of samples."""

    def __init__(self, samples):
        self._it = iter(samples)

    def get_next(self):
        return next(self._it, None)


CALIBRATORS: dict[str, tuple[str, dict[str, object]]] = {
    "minmax": ("MinMax", {}),
    "percentile": ("Percentile", {"percentile": 99.999, "symmetric": False}),
    "entropy": ("Entropy", {"num_bins": 2048, "num_quantized_bins": 128}),
}
"""ORT's calibrator and its options per ``--calibration-method``. MinMax takes each activation's
extreme values; Percentile clips each range at the 99.999th percentile of the values' magnitudes
(asymmetric: activations are uint8); Entropy picks the range that keeps the quantized histogram
closest (KL divergence) to the fp32 one."""


def check_calibration_method(method: str) -> str:
    """``method`` when it is one of :data:`~edgesplit.precision.CALIBRATION_METHODS`.

    Raises:
        CompileError: naming the methods there are.
    """
    if method not in CALIBRATION_METHODS:
        raise CompileError(
            f"unknown calibration method '{method}' (methods: {', '.join(CALIBRATION_METHODS)})"
        )
    return method


def calibrate(
    graph: ModelGraph, data: CalibrationSet, method: str = DEFAULT_CALIBRATION_METHOD
) -> Path:
    """The cached calibration of ``graph.model`` on ``data.calibration`` with ``method`` (one of
    :data:`~edgesplit.precision.CALIBRATION_METHODS`), computed if absent.

    Returns:
        The cache file (ORT's ``save_tensors_data`` JSON, which names the method), keyed by model
        and data sha256 and the method.
    """
    from onnxruntime.quantization.calibrate import (
        CalibrationMethod,
        create_calibrator,
        save_tensors_data,
    )

    ort_name, options = CALIBRATORS[check_calibration_method(method)]
    memo = (
        graph.sha256,
        tuple(sorted(graph.input_shapes().items())),
        data.sha256,
        method,
        str(cache_dir()),
    )
    if memo in _CALIBRATED and _CALIBRATED[memo].is_file():
        return _CALIBRATED[memo]
    tag = method + "".join(f"-{k}-{v}" for k, v in sorted(options.items()))  # options change ranges
    path = cache_dir() / f"{model_sha256(graph.model)[:24]}-{data.sha256[:24]}-{tag}.json"
    if path.is_file():
        _CALIBRATED[memo] = path
        return path
    with tempfile.TemporaryDirectory(prefix="edgesplit-calib-") as tmp, _quiet():
        model_path = Path(tmp) / "model.onnx"
        onnx.save(graph.model, model_path)
        calibrator = create_calibrator(
            model_path,
            None,
            augmented_model_path=str(Path(tmp) / "aug.onnx"),
            calibrate_method=CalibrationMethod[ort_name],
            extra_options=options,
        )
        calibrator.collect_data(_Reader(list(data.calibration)))
        save_tensors_data(calibrator.compute_data(), path)  # temp file and rename
    _CALIBRATED[memo] = path
    return path


def calibration_method_of(ranges: Path) -> str:
    """The method a cached calibration was made with (its file says)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    name = load_tensors_data(ranges).calibration_method.name
    return next((m for m, (ort_name, _) in CALIBRATORS.items() if ort_name == name), name)


_CALIBRATED: dict[tuple, Path] = {}  # this process's calibrations (hashing a big model costs)


def quantize_int8(
    model: onnx.ModelProto, ranges: Path | None, nodes: Sequence[str]
) -> onnx.ModelProto:
    """``model`` with ``nodes`` (all when empty) in int8 QDQ: per-channel int8 weights, uint8
    activations with the cached ranges.

    Raises:
        CompileError: without a calibration, or when ORT cannot quantize the model.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if ranges is None:
        raise CompileError("int8 needs a calibration (precision.convert.calibrate)")
    from onnxruntime.quantization.calibrate import load_tensors_data

    method = load_tensors_data(ranges).calibration_method  # ORT refuses a cache of another method
    model = opset_for_per_channel(model)
    with tempfile.TemporaryDirectory(prefix="edgesplit-quant-") as tmp, _quiet():
        out = Path(tmp) / "q.onnx"
        try:
            quantize_static(
                model,
                out,
                None,
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                reduce_range=False,  # VNNI and NPUs accumulate 8-bit products without saturating
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                nodes_to_quantize=list(nodes),
                calibrate_method=method,
                calibration_cache_path=ranges,
            )
        except Exception as e:  # noqa: BLE001 - ORT raises plain exceptions of many kinds
            raise CompileError(f"int8 quantization failed: {type(e).__name__}: {e}") from e
        return onnx.load(out)


PER_CHANNEL_OPSET = 13
"""DequantizeLinear takes the ``axis`` of per-channel weights from opset 13."""


def opset_for_per_channel(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` converted to opset 13 when it is older (PP-OCRv4's is 12), with ONNX's version
    converter (node names kept): ``quantize_static`` writes per-channel DequantizeLinear nodes
    without raising the opset, which ORT then refuses as an invalid graph.

    Raises:
        CompileError: when the converter cannot convert the model.
    """
    opset = next(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), PER_CHANNEL_OPSET
    )
    if opset >= PER_CHANNEL_OPSET:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, PER_CHANNEL_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions of many kinds
        raise CompileError(
            f"int8 needs opset {PER_CHANNEL_OPSET}; converting from {opset} failed: {e}"
        ) from e


def convert_fp16(
    model: onnx.ModelProto, ranges: Path | None, nodes: Sequence[str]
) -> onnx.ModelProto:
    """``model`` with ``nodes`` (all when empty) in float16, its inputs and outputs kept float32."""
    import warnings

    from onnxconverter_common import float16

    keep = set(nodes)
    block = [n.name for n in model.graph.node if keep and n.name not in keep]
    with _quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one warning per weight rounded to fp16's range
        return float16.convert_float_to_float16(model, keep_io_types=True, node_block_list=block)


def keep_fp32(model: onnx.ModelProto, ranges: Path | None, nodes: Sequence[str]) -> onnx.ModelProto:
    return model


CONVERTERS: dict[str, Converter] = {"fp32": keep_fp32, "fp16": convert_fp16, "int8": quantize_int8}
"""How a part becomes each precision, keyed by precision (not by backend)."""


def convert(
    model: onnx.ModelProto, precision: str, ranges: Path | None = None, nodes: Sequence[str] = ()
) -> onnx.ModelProto:
    """``model`` in ``precision`` (``fp32``, ``fp16`` or ``int8``; int8 needs ``ranges``)."""
    if precision not in CONVERTERS:
        raise CompileError(
            f"no converter to precision '{precision}' (precisions: {', '.join(CONVERTERS)})"
        )
    return CONVERTERS[precision](model, ranges, nodes)
