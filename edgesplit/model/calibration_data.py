"""Inputs to calibrate int8 quantization with, and to measure accuracy on.

Where they come from, in order:

1. ``--calibration-data PATH``: an ``.npz`` of arrays named after the model's inputs, or a folder
   of ``.npy`` files (``INPUT.npy`` per input; for a one-input model any ``*.npy``). Each array is
   one sample (the input's shape) or a stack of samples (one more leading axis).
2. For a vision model (one float input of shape ``(N, 3, H, W)``, H and W at least 8) without data:
   the photographs that ship inside scikit-image (``skimage.data``), resized to the input, with
   seeded crops, flips and brightness changes, normalised as torchvision's and PP-OCR's models
   expect (ImageNet mean and standard deviation).
3. Otherwise synthetic inputs (seeded normal noise), with a warning: accuracy measured on noise
   says little about accuracy on real data.

A :class:`CalibrationSet` carries the sha256 of its samples, which keys the calibration cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesplit.errors import InputError
from edgesplit.model.feeds import random_inputs
from edgesplit.model.graph import ModelGraph

PHOTOS = (
    "astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
    "retina", "colorwheel", "camera", "coins", "page", "text", "moon", "clock", "brick", "grass",
)  # fmt: skip
"""skimage.data images used, colour first; grey ones are repeated over three channels."""
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
DEFAULT_SAMPLES = 24
SYNTHETIC_WARNING = (
    "no calibration data and not a vision model: calibrating on synthetic noise; accuracy figures "
    "measured on it are weak (pass --calibration-data)"
)

Sample = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class CalibrationSet:
    """Samples of the model's inputs and where they came from.

    Attributes:
        source: ``file``, ``photos`` or ``synthetic``.
        origin: The file or folder, or which photographs.
        sha256: Of the samples' names, shapes, dtypes and bytes (keys the calibration cache).
        warning: Why the figures measured on these samples are weak, if they are.
    """

    samples: tuple[Sample, ...]
    source: str
    origin: str
    sha256: str
    warning: str = ""

    @property
    def calibration(self) -> tuple[Sample, ...]:
        """The samples quantization is calibrated on: the first two thirds."""
        return self.samples[: self._cut]

    @property
    def held_out(self) -> tuple[Sample, ...]:
        """The samples accuracy is measured on: the last third, never used to calibrate."""
        return self.samples[self._cut :]

    @property
    def _cut(self) -> int:
        return max(1, (2 * len(self.samples)) // 3) if len(self.samples) > 1 else 1

    def describe(self) -> dict[str, object]:
        """What a plan records about its data."""
        out: dict[str, object] = {
            "source": self.source,
            "origin": self.origin,
            "sha256": self.sha256,
        }
        out |= {
            "calibration_samples": len(self.calibration),
            "held_out_samples": len(self.held_out),
        }
        return out | ({"warning": self.warning} if self.warning else {})


def data_sha256(samples: Sequence[Sample]) -> str:
    h = hashlib.sha256()
    for s in samples:
        for name in sorted(s):
            a = np.ascontiguousarray(s[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _split(name: str, value: np.ndarray, graph: ModelGraph, source: str) -> list[np.ndarray]:
    """One input's array as a list of samples (it is one sample, or a stack of them)."""
    info = graph.tensors[name]
    want = tuple(info.shape)
    if tuple(value.shape) == want:
        samples = [value]
    elif tuple(value.shape[1:]) == want:
        samples = list(value)
    else:
        raise InputError(
            f"{source}: '{name}' has shape {list(value.shape)}, the model wants {list(want)}"
        )
    if value.dtype.kind != np.dtype(info.dtype).kind:
        raise InputError(f"{source}: '{name}' is {value.dtype}, the model wants {info.dtype}")
    return [np.ascontiguousarray(s, dtype=info.dtype) for s in samples]


def _arrays(path: Path, graph: ModelGraph) -> dict[str, list[np.ndarray]]:
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            found = {k: z[k] for k in z.files}
        return {
            k: _split(k, v, graph, str(path)) for k, v in found.items() if k in graph.inputs
        } | {k: [] for k in found if k not in graph.inputs}
    files = sorted(path.glob("*.npy"))
    named = {f.stem: f for f in files if f.stem in graph.inputs}
    if not named and len(graph.inputs) == 1:  # any .npy file holds samples of the one input
        (only,) = graph.inputs
        stacks = [_split(only, np.load(f, allow_pickle=False), graph, str(f)) for f in files]
        return {only: [s for stack in stacks for s in stack]}
    return {k: _split(k, np.load(f, allow_pickle=False), graph, str(f)) for k, f in named.items()}


def load_samples(path: str | os.PathLike, graph: ModelGraph) -> list[dict[str, np.ndarray]]:
    """The samples in an ``.npz`` or a folder of ``.npy`` files (see the module doc).

    Raises:
        InputError: naming the file, for a missing path, an unknown or missing input, a wrong
            shape or dtype, inputs with different sample counts, or no samples.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such calibration data (an .npz file or a folder of .npy files)")
    try:
        arrays = _arrays(p, graph)
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot read calibration data ({e})") from e
    unknown = [k for k, v in arrays.items() if k not in graph.inputs]
    missing = [k for k in graph.inputs if k not in arrays]
    if unknown or missing:
        what = [f"unknown inputs {unknown}"] * bool(unknown) + [f"missing inputs {missing}"] * bool(
            missing
        )
        raise InputError(f"{p}: {'; '.join(what)} (model inputs: {list(graph.inputs)})")
    counts = {k: len(v) for k, v in arrays.items()}
    if len(set(counts.values())) != 1 or not next(iter(counts.values())):
        raise InputError(
            f"{p}: every input needs the same number of samples, at least one (found {counts})"
        )
    n = next(iter(counts.values()))
    return [{k: arrays[k][i] for k in graph.inputs} for i in range(n)]


def image_layout(graph: ModelGraph) -> tuple[str, int, int, int] | None:
    """``(input, batch, height, width)`` with the layout's channel axis, for a vision model; else
    None."""
    if len(graph.inputs) != 1:
        return None
    (name,) = graph.inputs
    info = graph.tensors[name]
    if np.dtype(info.dtype).kind != "f" or len(info.shape) != 4:
        return None
    n, a, b, c = info.shape
    if a == 3 and min(b, c) >= 8:
        return name, n, b, c
    return None


def photo_samples(
    graph: ModelGraph, count: int = DEFAULT_SAMPLES, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """Seeded augmented crops of ``skimage.data`` photographs, as NCHW inputs of the vision
    model."""
    layout = image_layout(graph)
    assert layout is not None, "not a vision model"
    name, batch, height, width = layout
    images = _photo_images(height, width, count * batch, seed)
    dtype = graph.tensors[name].dtype
    return [
        {name: np.stack(images[k * batch : (k + 1) * batch]).astype(dtype)} for k in range(count)
    ]


@functools.cache
def _photographs() -> tuple[np.ndarray, ...]:
    """The ``PHOTOS``, decoded once per process as ``(H, W, 3)`` uint8 (about 12 MB)."""
    from skimage import data as photos
    from skimage.color import gray2rgb

    out = []
    for name in PHOTOS:
        img = getattr(photos, name)()
        img = gray2rgb(img) if img.ndim == 2 else img[..., :3]
        img.setflags(write=False)
        out.append(img)
    return tuple(out)


@functools.lru_cache(maxsize=2)
def _photo_images(height: int, width: int, n: int, seed: int) -> tuple[np.ndarray, ...]:
    """The ``n`` normalised CHW crops behind :func:`photo_samples`, kept (read-only) for the next
    call with the same size and seed: a partition with an accuracy budget asks for the same set
    several times. Two sizes are kept: as much memory as the calibration sets a caller holds anyway.

    Crops are resized by Pillow's bilinear filter, which widens with the scale, so it smooths before
    it shrinks as an anti-aliased resize must: 16 crops to 224x224 in 0.07 s, against 0.47 s with
    scikit-image's Gaussian pre-filter and spline (measured here, 2026-12-05). Of Pillow's filters
    it smooths most like that one: an int8 conv block calibrated on them kept 25.0 dB of SNR,
    25.1 dB on scikit-image's, 24.5 dB on Lanczos (tests/test_precision.py)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        img = _photographs()[i % len(PHOTOS)]
        h, w = img.shape[:2]
        scale = rng.uniform(0.6, 1.0)
        ch, cw = max(8, int(h * scale)), max(8, int(w * scale))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = img[y : y + ch, x : x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        resized = Image.fromarray(np.ascontiguousarray(crop)).resize(
            (width, height), Image.Resampling.BILINEAR
        )
        pic = np.asarray(resized, dtype=np.float32) / np.float32(255.0)  # floats in [0, 1]
        pic = np.clip(pic * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1), 0.0, 1.0)
        chw = ((pic - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1).astype(np.float32)
        chw.setflags(write=False)
        images.append(chw)
    return tuple(images)


def calibration_set(
    graph: ModelGraph, path: str | os.PathLike | None = None, count: int = DEFAULT_SAMPLES
) -> CalibrationSet:
    """The samples to calibrate and measure ``graph`` with: from ``path``, else photographs for a
    vision model, else synthetic (with a warning); see the module doc."""
    if path is not None:
        samples = load_samples(path, graph)
        return CalibrationSet(tuple(samples), "file", str(path), data_sha256(samples))
    if image_layout(graph) is not None:
        samples = photo_samples(graph, count)
        origin = (
            "skimage.data photographs, augmented ("
            + ", ".join(PHOTOS[: min(count, len(PHOTOS))])
            + ")"
        )
        return CalibrationSet(tuple(samples), "photos", origin, data_sha256(samples))
    samples = [random_inputs(graph, seed) for seed in range(count)]
    return CalibrationSet(
        tuple(samples), "synthetic", "seeded normal noise", data_sha256(samples), SYNTHETIC_WARNING
    )
