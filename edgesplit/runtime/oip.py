"""The Open Inference Protocol v2 (KServe v2 / Triton REST) codec, with the binary tensor extension.

A request or response body is a JSON header, optionally followed by raw tensor bytes. When raw
bytes follow, the HTTP header ``Inference-Header-Content-Length`` gives the JSON header's length,
each binary tensor carries ``parameters.binary_data_size``, and the raw bytes follow the header in
the order of the tensors. Tensors without that parameter carry their values in ``data`` (row-major,
flat or nested). Only numeric and boolean tensors are supported (no ``BYTES``).

Decoding is zero-copy: a binary tensor is a numpy view of the body it came in (writable when the
body is a ``bytearray``). Malformed input raises :class:`~edgesplit.errors.RunInputError` with a
one-line message fit for a 400 answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesplit.errors import InputError, RunInputError

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_RANK = 32  # numpy allows 64 dimensions; no model input has more than a handful

# OIP datatype -> numpy dtype name.
OIP_TO_NUMPY: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
NUMPY_TO_OIP: dict[str, str] = {v: k for k, v in OIP_TO_NUMPY.items()}


def oip_datatype(dtype: str | np.dtype) -> str:
    """The OIP datatype of a numpy dtype (``float32`` -> ``FP32``)."""
    name = np.dtype(dtype).name
    if name not in NUMPY_TO_OIP:
        raise RunInputError(f"dtype {name} has no Open Inference Protocol datatype")
    return NUMPY_TO_OIP[name]


@dataclass(frozen=True)
class InferRequest:
    """A decoded inference request.

    Attributes:
        inputs: Input name -> array (views of the request body for binary tensors).
        outputs: The outputs asked for, by name, in order; None when the request names none (all).
        binary_outputs: Names of the outputs to answer with binary data.
        binary_default: Whether outputs the request did not name are answered in binary
            (the top-level ``binary_data_output`` parameter).
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...] | None
    binary_outputs: frozenset[str]
    binary_default: bool


def _fail(msg: str) -> RunInputError:
    return RunInputError(msg)


_MODEL_PREFIX_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def check_model_prefix(prefix: str, what: str = "the model prefix") -> str:
    """``prefix`` if models may be named ``<prefix>_<part>`` on a server: letters, digits, ``_``,
    ``.`` and ``-`` (what Triton's repository folders and a URL path take unescaped), at most 128.

    Raises :class:`~edgesplit.errors.InputError` naming the first bad character."""
    bad = next((ch for ch in prefix if ch not in _MODEL_PREFIX_CHARS), None)
    if bad is not None:
        raise InputError(
            f"{what} {prefix!r} holds {bad!r}: only letters, digits, '_', '.' and '-' can name a "
            "model"
        )
    if len(prefix) > 128:
        raise InputError(f"{what} is {len(prefix)} characters long: at most 128")
    return prefix


def served_name(part: str, model_prefix: str = "") -> str:
    """The name a server gives part ``part``'s model: ``<model_prefix>_<part>``, or ``part``."""
    return f"{model_prefix}_{part}" if model_prefix else part


def check_bearer_token(token: str, what: str = "the bearer token") -> str:
    """``token`` if it can go in an ``Authorization`` header: visible ASCII only (no CR, LF, space).

    Raises :class:`~edgesplit.errors.InputError` naming the first bad character's position, never
    the token itself.
    """
    for i, ch in enumerate(token):
        if not "\x21" <= ch <= "\x7e":
            kind = {"\r": "a carriage return (CR)", "\n": "a line feed (LF)", " ": "a space"}.get(
                ch,
                "a control character"
                if ord(ch) < 0x21 or ord(ch) == 0x7F
                else "a non-ASCII character",
            )
            raise InputError(
                f"{what} holds {kind} at position {i + 1}: only visible ASCII characters can go in "
                "an "
                "HTTP header"
            )
    if not token:
        raise InputError(f"{what} is empty: a token is one or more visible ASCII characters")
    return token


def parse_header_length(value: str | None, body_nbytes: int) -> int | None:
    """Validate an ``Inference-Header-Content-Length`` header value against the body size."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise _fail(f"{HEADER_LENGTH} is not an integer: {value[:40]!r}") from None
    if n < 0 or n > body_nbytes:
        raise _fail(f"{HEADER_LENGTH} {n} is outside the body of {body_nbytes} bytes")
    return n


def _load_header(
    body: bytes | bytearray | memoryview, header_nbytes: int | None
) -> tuple[dict, int]:
    end = len(body) if header_nbytes is None else header_nbytes
    try:
        header = json.loads(bytes(body[:end]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(f"the request header is not valid JSON ({e})") from e
    except RecursionError:
        raise _fail("the request header is not valid JSON (nested too deeply)") from None
    if not isinstance(header, dict):
        raise _fail("the request header must be a JSON object")
    return header, end


def _shape(t: Mapping[str, Any], what: str) -> tuple[int, ...]:
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _fail(f"{what}: 'shape' must be a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise _fail(
            f"{what}: 'shape' has {len(shape)} dimensions, at most {MAX_RANK} are supported"
        )
    if math.prod(d for d in shape if d) >= 1 << 40:
        raise _fail(f"{what}: shape {_short(shape)} is too large for any array")
    return tuple(shape)


def _short(values: list, n: int = 8) -> str:
    return str(values) if len(values) <= n else f"[{', '.join(map(str, values[:n]))}, ...]"


def _dtype(t: Mapping[str, Any], what: str) -> np.dtype:
    datatype = t.get("datatype")
    if datatype not in OIP_TO_NUMPY:
        raise _fail(
            f"{what}: unsupported datatype {datatype!r} (supported: {', '.join(OIP_TO_NUMPY)})"
        )
    return np.dtype(OIP_TO_NUMPY[datatype])


def _params(d: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    p = d.get("parameters") or {}
    if not isinstance(p, dict):
        raise _fail(f"{what}: 'parameters' must be a JSON object")
    return p


@dataclass(frozen=True)
class TensorDecl:
    """A tensor as a JSON header declares it, before its data is read."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    binary_nbytes: int | None  # None: its values are in the JSON 'data'
    what: str  # how messages name it: "input 'x'"


def _declared(t: Any, i: int, kind: str) -> TensorDecl:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise _fail(f"{kind}[{i}] must be an object with a string 'name'")
    what = f"{kind[:-1]} '{t['name'][:64]}'"
    shape, dtype = _shape(t, what), _dtype(t, what)
    size = _params(t, what).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _fail(f"{what}: binary_data_size must be a non-negative integer")
        if size != math.prod(shape) * dtype.itemsize:
            raise _fail(
                f"{what}: binary_data_size {size} does not match shape {_short(list(shape))} of "
                f"{dtype.name} ({math.prod(shape) * dtype.itemsize} bytes)"
            )
    return TensorDecl(t["name"], dtype, shape, size, what)


def declared_inputs(header_bytes: bytes | bytearray | memoryview) -> list[TensorDecl]:
    """The inputs a request's JSON header declares, so a server can refuse them before their data
    arrives."""
    header, _ = _load_header(header_bytes, None)
    tensors = header.get("inputs")
    if not isinstance(tensors, list):
        raise _fail("'inputs' must be a list of tensors")
    return [_declared(t, i, "inputs") for i, t in enumerate(tensors)]


def _decode_tensors(
    tensors: Any, body: bytes | bytearray | memoryview, offset: int, kind: str
) -> dict[str, np.ndarray]:
    """Decode a list of OIP tensors (the ``inputs`` of a request or ``outputs`` of a response)."""
    if not isinstance(tensors, list):
        raise _fail(f"'{kind}' must be a list of tensors")
    view = memoryview(body)
    out: dict[str, np.ndarray] = {}
    for i, t in enumerate(tensors):
        d = _declared(t, i, kind)
        what, shape, dtype, size = d.what, d.shape, d.dtype, d.binary_nbytes
        count = math.prod(shape)
        if size is not None:
            if offset + size > len(view):
                raise _fail(
                    f"{what}: binary data runs past the end of the body ({offset + size} > "
                    f"{len(view)} bytes)"
                )
            arr = np.frombuffer(view[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        elif "data" in t:
            try:
                arr = np.asarray(t["data"], dtype=dtype)
            except (TypeError, ValueError, OverflowError) as e:
                raise _fail(
                    f"{what}: 'data' is not a list of {dtype.name} values ({str(e)[:200]})"
                ) from e
            except RecursionError:
                raise _fail(f"{what}: 'data' is nested too deeply") from None
            if arr.size != count:
                raise _fail(
                    f"{what}: 'data' holds {arr.size} values, shape {_short(list(shape))} needs "
                    f"{count}"
                )
            arr = arr.reshape(shape)
        else:
            raise _fail(f"{what}: neither 'data' nor parameters.binary_data_size")
        if d.name in out:
            raise _fail(f"{what} appears twice")
        out[d.name] = arr
    if offset != len(view):
        raise _fail(
            f"the body holds {len(view) - offset} bytes beyond its header and binary tensors"
        )
    return out


def decode_request(body: bytes | bytearray | memoryview, header_nbytes: int | None) -> InferRequest:
    """Decode an inference request body; ``header_nbytes`` from
    ``Inference-Header-Content-Length``."""
    header, offset = _load_header(body, header_nbytes)
    rid = header.get("id")
    if rid is not None and not isinstance(rid, str):
        raise _fail("'id' must be a string")
    binary_default = bool(_params(header, "request").get("binary_data_output", False))
    inputs = _decode_tensors(header.get("inputs"), body, offset, "inputs")
    outputs, binary = None, set()
    if header.get("outputs") is not None:
        if not isinstance(header["outputs"], list):
            raise _fail("'outputs' must be a list")
        names = []
        for i, o in enumerate(header["outputs"]):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise _fail(f"outputs[{i}] must be an object with a string 'name'")
            names.append(o["name"])
            if _params(o, f"output '{o['name']}'").get("binary_data", binary_default):
                binary.add(o["name"])
        outputs = tuple(names)
    return InferRequest(rid, inputs, outputs, frozenset(binary), binary_default)


def _tensor_header(name: str, arr: np.ndarray, binary: bool) -> dict[str, Any]:
    t: dict[str, Any] = {
        "name": name,
        "datatype": oip_datatype(arr.dtype),
        "shape": list(arr.shape),
    }
    if binary:
        t["parameters"] = {"binary_data_size": arr.nbytes}
    else:
        t["data"] = arr.ravel().tolist()
    return t


def _raw(arr: np.ndarray) -> memoryview:
    if arr.size == 0:  # a memoryview with a zero in its shape cannot be cast (an empty KV cache)
        return memoryview(b"")
    return memoryview(np.ascontiguousarray(arr)).cast("B")


def _encode(
    header: dict[str, Any], tensors: Iterable[tuple[np.ndarray, bool]]
) -> tuple[list[bytes | memoryview], int | None]:
    head = json.dumps(header, separators=(",", ":")).encode()
    chunks: list[bytes | memoryview] = [head]
    chunks += [_raw(a) for a, binary in tensors if binary]
    return chunks, (len(head) if len(chunks) > 1 else None)


def encode_request(
    inputs: Mapping[str, np.ndarray],
    outputs: Iterable[str] | None = None,
    *,
    binary: bool = True,
    request_id: str | None = None,
) -> tuple[list[bytes | memoryview], int | None]:
    """Encode a request: the body's chunks (JSON header first) and the header length (None: JSON
    only)."""
    header: dict[str, Any] = {}
    if request_id is not None:
        header["id"] = request_id
    arrays = [(n, np.asarray(a)) for n, a in inputs.items()]
    header["inputs"] = [_tensor_header(n, a, binary) for n, a in arrays]
    if outputs is not None:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in outputs]
    else:
        header["parameters"] = {"binary_data_output": binary}
    return _encode(header, ((a, binary) for _, a in arrays))


def encode_response(
    model_name: str,
    outputs: Mapping[str, np.ndarray],
    binary: Iterable[str],
    *,
    request_id: str | None = None,
    model_version: str = "1",
) -> tuple[list[bytes | memoryview], int | None]:
    """Encode a response; outputs named in ``binary`` go as raw bytes, the others as JSON data."""
    binary = set(binary)
    header: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        header["id"] = request_id
    arrays = [(n, np.asarray(a)) for n, a in outputs.items()]
    header["outputs"] = [_tensor_header(n, a, n in binary) for n, a in arrays]
    return _encode(header, ((a, n in binary) for n, a in arrays))


def decode_response(
    body: bytes | bytearray | memoryview, header_nbytes: int | None
) -> dict[str, np.ndarray]:
    """Decode a response body into output name -> array (views of ``body`` for binary outputs)."""
    header, offset = _load_header(body, header_nbytes)
    return _decode_tensors(header.get("outputs"), body, offset, "outputs")
