"""Block-quantized weights in the layout of ORT's ``MatMulNBits``, and quantizers making them.

A weight ``W`` ``(K, N)`` (MatMul's layout) is stored per output column ``n`` in blocks of
``block_size`` along ``K``; each block ``b`` has a scale, an integer zero point and, optionally, a
float offset: ``W[k, n] = scales[n, b] * (q[n, k] - zero_points[n, b]) + offsets[n, b]``.
Pure numpy, except ``k_quant``, which is ``onnxruntime.quantization``'s own search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_METHODS = ("k_quant", "minmax_offset", "sym8")
"""``k_quant``: ORT's k-quant search (llama.cpp's weighted grid search), integer zero points;
``minmax_offset``: each block's minimum to maximum in 15 steps, the minimum as a float offset
(llama.cpp's Q4_1); ``sym8``: 8-bit symmetric, ``absmax / 127`` per block (llama.cpp's Q8_0)."""


@dataclass(frozen=True)
class BlockWeights:
    """One weight in blocks (see the module doc).

    Attributes:
        q: ``(N, K)`` uint8, each in ``0 .. 2**bits - 1``.
        scales: ``(N, K // block_size)`` float32.
        zero_points: ``(N, K // block_size)`` uint8; None means ``2**(bits - 1)``, ORT's default.
        offsets: ``(N, K // block_size)`` float32 added to every weight of a block, or None.
        bits: 4 or 8.
        block_size: Weights per block along ``K``.
    """

    q: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None = None
    offsets: np.ndarray | None = None
    bits: int = 4
    block_size: int = 32

    def __post_init__(self) -> None:
        n, k = self.q.shape
        blocks = (n, k // self.block_size)
        bad = [
            name
            for name, a in (
                ("scales", self.scales),
                ("zero_points", self.zero_points),
                ("offsets", self.offsets),
            )  # fmt: skip
            if a is not None and a.shape != blocks
        ]
        if self.bits not in (4, 8) or k % self.block_size or bad:
            raise ValueError(
                f"blocks: q {self.q.shape}, block {self.block_size}, bits {self.bits}; "
                f"{', '.join(bad) or 'no array'} not {blocks}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        """``(K, N)``: the float weight's shape."""
        return self.q.shape[1], self.q.shape[0]

    def rows(self, order: np.ndarray) -> BlockWeights:
        """The same blocks with output columns ``n`` taken in ``order``."""
        pick = lambda a: None if a is None else np.ascontiguousarray(a[order])  # noqa: E731
        return BlockWeights(
            pick(self.q), pick(self.scales), pick(self.zero_points), pick(self.offsets),
            self.bits, self.block_size,
        )  # fmt: skip

    def centered(self) -> BlockWeights:
        """The same weights with each block's integer zero point moved to the one nearest
        ``-offset / scale`` (within ``0 .. 2**bits - 1``), the offsets reduced to match.

        Exact: ``scale * (q - z) + offset == scale * (q - z') + (offset + (z' - z) * scale)``.
        The remaining offsets lie within half a step for a block that straddles zero, and the
        ``q - z'`` that an int8-activation kernel multiplies are centred on zero, which halves
        their rounding error.
        """
        if self.offsets is None:
            return self
        zp = self._zero_points()
        u = np.divide(self.offsets, self.scales, out=np.zeros_like(self.offsets),
                      where=self.scales != 0)  # fmt: skip
        z = np.clip(np.rint(zp - u), 0, 2**self.bits - 1)
        offsets = self.offsets + (z - zp) * self.scales
        return BlockWeights(self.q, self.scales, z.astype(np.uint8), offsets.astype(np.float32),
                            self.bits, self.block_size)  # fmt: skip

    def offset_digits(self, digits: int = 2, ratio: float = 14.0) -> tuple[BlockWeights, int]:
        """Weights without offsets for the input ``[x, S, S, ...]``: ``x``'s ``K`` values, then
        ``digits`` copies of its block sums ``S`` (``K / block_size`` values padded to whole
        blocks, ``P`` in all), and the padded width ``P``.

        The offsets become ``digits`` extra 4-bit blocks per output in base ``ratio``
        (symmetric, zero point 8): the first has scale ``s = max|offset| / 7`` of its block of
        offsets, the next ``s / ratio`` and so on, each digit rounding what the ones before
        left. The error in an offset is at most ``s / (2 * ratio ** (digits - 1))``.

        Raises:
            ValueError: without offsets, or with 8-bit weights.
        """
        if self.offsets is None or self.bits != 4:
            raise ValueError("offset digits need 4-bit blocks with offsets")
        n, k = self.q.shape
        per = self.block_size
        width = -(-self.offsets.shape[1] // per) * per
        off = np.zeros((n, width), np.float64)
        off[:, : self.offsets.shape[1]] = self.offsets
        off = off.reshape(n, -1, per)
        scale = np.abs(off).max(axis=-1) / 7.0
        scale = np.where(scale > 0, scale, 1.0)
        q, scales, zp = [self.q], [self.scales], [self._zero_points().astype(np.uint8)]
        left = off
        for j in range(digits):
            step = scale / ratio**j
            digit = np.clip(np.rint(left / step[..., None]), -8, 7)
            left = left - digit * step[..., None]
            q.append((digit + 8).astype(np.uint8).reshape(n, width))
            scales.append(step.astype(np.float32))
            zp.append(np.full(step.shape, 8, np.uint8))
        cat = lambda a: np.ascontiguousarray(np.concatenate(a, axis=1))  # noqa: E731
        return BlockWeights(cat(q), cat(scales), cat(zp), None, 4, per), width

    def as_8bit(self) -> BlockWeights:
        """4-bit blocks with offsets as 8-bit blocks without: scale ``scale / 16``, integer zero
        point, each offset rounded to ``scale / 16`` (an error of at most ``scale / 32`` per
        weight, a sixteenth of the 4-bit rounding).

        Raises:
            ValueError: when a block's offset lies outside what an 8-bit zero point reaches
                (``-offset / scale`` beyond ``-1 .. 16`` for zero points of 0).
        """
        if self.bits != 4:
            raise ValueError("8-bit blocks from 4-bit blocks only")
        n, k = self.q.shape
        zp = self._zero_points()
        off = self.offsets if self.offsets is not None else np.zeros(self.scales.shape)
        u = np.divide(off, self.scales, out=np.zeros_like(off), where=self.scales != 0)
        r = np.floor(16 * (u - zp) + 0.5)  # w = scale / 16 * (16 q + r)
        z8 = np.clip(-r, 0, 255)
        q8 = 16 * self.q.reshape(n, -1, self.block_size).astype(np.int64) + (r + z8)[..., None]
        if q8.min() < 0 or q8.max() > 255 or z8.max() > 255:
            raise ValueError("offsets beyond an 8-bit zero point's reach")
        return BlockWeights(q8.reshape(n, k).astype(np.uint8), self.scales / 16,
                            z8.astype(np.uint8), None, 8, self.block_size)  # fmt: skip

    def _zero_points(self) -> np.ndarray:
        """The zero points as floats, ORT's default filled in."""
        zp = self.zero_points if self.zero_points is not None else 2 ** (self.bits - 1)
        return np.broadcast_to(np.asarray(zp, np.float64), self.scales.shape).copy()

    def dequantize(self) -> np.ndarray:
        """The float32 weight ``(K, N)``."""
        n, k = self.q.shape
        zp = self.zero_points if self.zero_points is not None else 2 ** (self.bits - 1)
        zp = np.broadcast_to(np.asarray(zp, np.float32), self.scales.shape)
        q = self.q.reshape(n, -1, self.block_size).astype(np.float32)
        w = self.scales[..., None] * (q - zp[..., None])
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return np.ascontiguousarray(w.reshape(n, k).T.astype(np.float32))

    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``MatMulNBits``'s inputs ``B`` ``(N, blocks, block_size * bits / 8)``, ``scales``
        ``(N * blocks,)`` and ``zero_points`` (packed like ``B``, a row per ``n``) or None."""
        n, k = self.q.shape
        blocks = k // self.block_size
        q = self.q.astype(np.uint8)
        if self.bits == 4:
            q = q[:, 0::2] | (q[:, 1::2] << 4)  # element 2i in the low nibble, 2i+1 in the high
        b = np.ascontiguousarray(q.reshape(n, blocks, -1))
        zp = None
        if self.zero_points is not None:
            zp = self.zero_points.astype(np.uint8)
            if self.bits == 4:
                if blocks % 2:
                    zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
                zp = zp[:, 0::2] | (zp[:, 1::2] << 4)
            zp = np.ascontiguousarray(zp.reshape(-1))
        return b, np.ascontiguousarray(self.scales.reshape(-1).astype(np.float32)), zp


def quantize_blocks(weight: np.ndarray, method: str, block_size: int = 32) -> BlockWeights:
    """``weight`` ``(K, N)`` in blocks by ``method`` (one of :data:`BLOCK_METHODS`).

    Raises:
        ValueError: for an unknown method, or ``K`` not a multiple of ``block_size``.
    """
    k, n = weight.shape
    if k % block_size or method not in BLOCK_METHODS:
        raise ValueError(f"blocks: K {k} by {block_size}, method '{method}' ({BLOCK_METHODS})")
    blocks = np.ascontiguousarray(weight.T, dtype=np.float32).reshape(n, k // block_size, -1)
    if method == "sym8":
        scale = np.abs(blocks).max(axis=-1) / 127.0
        inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        q = np.clip(np.rint(blocks * inv[..., None]), -127, 127) + 128
        return BlockWeights(q.reshape(n, k).astype(np.uint8), scale.astype(np.float32),
                            bits=8, block_size=block_size)  # fmt: skip
    if method == "minmax_offset":
        low, high = blocks.min(axis=-1), blocks.max(axis=-1)
        scale = (high - low) / 15.0
        inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        q = np.clip(np.rint((blocks - low[..., None]) * inv[..., None]), 0, 15)
        zero = np.zeros(scale.shape, np.uint8)
        return BlockWeights(q.reshape(n, k).astype(np.uint8), scale.astype(np.float32), zero,
                            low.astype(np.float32), 4, block_size)  # fmt: skip
    from onnxruntime.quantization.neural_compressor.weight_only import quant_tensor_k_quant_cpu

    q, scale, zero = quant_tensor_k_quant_cpu(weight.T.astype(np.float32), 4, block_size)
    shape = (n, k // block_size)
    return BlockWeights(q.reshape(n, k).astype(np.uint8), scale.reshape(shape).astype(np.float32),
                        zero.reshape(shape).astype(np.uint8), None, 4, block_size)  # fmt: skip
