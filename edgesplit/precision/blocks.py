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
