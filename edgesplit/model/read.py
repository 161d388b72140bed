"""Read an ONNX file within the size limit, its external data counted before any of it is read.

A small ``model.onnx`` can point at gigabytes of external weights, so the limit covers the file
plus every external region it declares (from the ``length`` fields, or the file sizes where
lengths are missing). External files must lie inside the model's folder, exist, and hold the
bytes each tensor's shape needs; every problem names the model and the tensor.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from edgesplit.errors import ModelLoadError
from edgesplit.model.scope import all_tensors


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's text, at most 300 characters."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0].strip()[:300] if lines else type(e).__name__


@dataclass(frozen=True)
class ExternalRegion:
    """Where one tensor's external bytes live: a file inside the model's folder, offset, length."""

    tensor: onnx.TensorProto
    file: Path
    offset: int
    nbytes: int


def read_model(path: Path, max_model_mb: float) -> tuple[onnx.ModelProto, str]:
    """Parse ``path`` with its external data; return the model and the sha256 of the file.

    Raises:
        ModelLoadError: not a regular file, empty, not ONNX, over the limit (external data
            included), or external data that is missing, outside the folder, or too short.
    """
    where = str(path)
    _check_regular_file(path)
    size = path.stat().st_size
    limit = max_model_mb * 1e6
    if size == 0:
        raise ModelLoadError(where, "empty file")
    if size > limit:
        raise ModelLoadError(
            where, f"{size / 1e6:.1f} MB is over the model size limit of {max_model_mb:g} MB"
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelLoadError(where, f"cannot read ({e.strerror or e})") from e
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ModelLoadError(where, f"not an ONNX model, or truncated ({first_line(e)})") from e
    if model.ir_version == 0 or not model.HasField("graph") or not model.opset_import:
        raise ModelLoadError(
            where, "not an ONNX model, or truncated (no IR version, graph or opset import)"
        )
    regions = external_regions(path, model)
    external = sum(r.nbytes for r in {(r.file, r.offset, r.nbytes): r for r in regions}.values())
    if size + external > limit:
        files = sorted({r.file.name for r in regions})
        shown = ", ".join(files[:3]) + (" ..." if len(files) > 3 else "")
        raise ModelLoadError(
            where,
            f"{external / 1e6:.1f} MB of external data ({shown}) plus {size / 1e6:.1f} MB of model "
            "is over "
            f"the model size limit of {max_model_mb:g} MB",
        )
    for r in regions:
        _read_region(where, r)
    return model, hashlib.sha256(data).hexdigest()


def _check_regular_file(path: Path) -> None:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelLoadError(str(path), "no such file") from None
    except OSError as e:
        raise ModelLoadError(str(path), f"cannot read ({e.strerror or e})") from e
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError(str(path), "is a directory, not an ONNX file")
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(str(path), "not a regular file")


def external_regions(path: Path, model: onnx.ModelProto) -> list[ExternalRegion]:
    """The external regions the model's tensors declare, checked without reading them.

    Raises:
        ModelLoadError: listing every tensor whose external data is missing, outside the model's
            folder, malformed, or shorter than its shape needs.
    """
    base = path.resolve().parent
    out: list[ExternalRegion] = []
    problems: list[str] = []
    sizes: dict[Path, int] = {}
    for t in all_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        try:
            out.append(_region(t, base, sizes))
        except ValueError as e:
            problems.append(f"tensor '{t.name}': {e}")
        if len(problems) >= 10:
            problems.append("...")
            break
    if problems:
        raise ModelLoadError(str(path), problems)
    return out


def _region(t: onnx.TensorProto, base: Path, sizes: dict[Path, int]) -> ExternalRegion:
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if not location:
        raise ValueError("external data without a location")
    rel = Path(location)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"external data '{location}' is outside the model's folder")
    file = (base / rel).resolve()
    if not file.is_relative_to(base):
        raise ValueError(f"external data '{location}' is outside the model's folder")
    if file not in sizes:
        try:
            st = file.stat()
        except OSError:
            raise ValueError(f"external data file '{location}' is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"external data '{location}' is not a regular file")
        sizes[file] = st.st_size
    try:
        offset = int(info.get("offset", "0") or 0)
        length = int(info["length"]) if info.get("length") else sizes[file] - offset
    except ValueError:
        raise ValueError(f"external data '{location}' has a malformed offset or length") from None
    if offset < 0 or length < 0 or offset + length > sizes[file]:
        raise ValueError(
            f"external data runs past the end of '{location}' "
            f"(bytes {offset}..{offset + length} of {sizes[file]})"
        )
    needed = _declared_nbytes(t)
    if needed is not None and length < needed:
        raise ValueError(
            f"external data in '{location}' holds {length} bytes, its shape needs {needed}"
        )
    return ExternalRegion(t, file, offset, length)


def _declared_nbytes(t: onnx.TensorProto) -> int | None:
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:  # noqa: BLE001 - sub-byte or unknown types: no check
        return None
    return math.prod(t.dims) * itemsize


def _read_region(where: str, r: ExternalRegion) -> None:
    """Read one region into its tensor (the path was checked to lie inside the model's folder)."""
    try:
        fd = os.open(r.file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            f.seek(r.offset)
            data = f.read(r.nbytes)
    except OSError as e:
        raise ModelLoadError(
            where, f"tensor '{r.tensor.name}': cannot read external data ({e})"
        ) from e
    if len(data) != r.nbytes:
        raise ModelLoadError(
            where, f"tensor '{r.tensor.name}': external data '{r.file.name}' is truncated"
        )
    r.tensor.raw_data = data
    del r.tensor.external_data[:]
    r.tensor.data_location = onnx.TensorProto.DEFAULT
