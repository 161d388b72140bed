"""The KV cache between generation steps: ONNX Runtime values that stay where the step left them.

A step's ``present.N.key/value`` outputs are bound, as the same :class:`onnxruntime.OrtValue`, to
the next step's ``past_key_values.N.key/value`` inputs: the cache never passes through numpy and
never leaves the processor of the session that made it. :class:`KVCache` records, for every
hand-off, whether the buffer bound as past is the one the previous step returned (same address),
so that copies are counted, not assumed.

What stays: the graph itself appends a step's keys to the past with ``Concat`` (the layout ORT
GenAI and Optimum export without a shared past/present buffer), so ORT writes a new present
buffer per step inside the run. What is counted here is every copy *between* steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from edgesplit.model.zoo_decoder import DecoderConfig


@dataclass
class CacheCounts:
    """What happened to the cache between steps.

    Attributes:
        handoffs: Cache tensors passed from one step's outputs to the next step's inputs.
        copies: Of those, the tensors that reached the next step in another buffer.
        copied_nbytes: Bytes those copies moved.
    """

    handoffs: int = 0
    copies: int = 0
    copied_nbytes: int = 0


@dataclass
class KVCache:
    """Per-layer past keys and values as OrtValues, the positions they hold, and their mask.

    Attributes:
        names: (past input, present output) per cache tensor.
        values: past input name -> OrtValue (the current cache).
        mask: 1 for each slot holding a real token, 0 for a padded slot.
        device: Where the OrtValues live (``"cpu"``).
        counts: Hand-offs and copies so far.
    """

    names: list[tuple[str, str]]
    values: dict[str, ort.OrtValue]
    mask: list[int] = field(default_factory=list)
    device: str = "cpu"
    counts: CacheCounts = field(default_factory=CacheCounts)

    @staticmethod
    def empty(config: DecoderConfig, names: list[tuple[str, str]], device: str = "cpu") -> KVCache:
        shape = (1, config.kv_heads, 0, config.head_dim)
        values = {
            past: ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32), device)
            for past, _ in names
        }
        return KVCache(names, values, [], device)

    @property
    def slots(self) -> int:
        """Positions in the cache, padded ones included."""
        return len(self.mask)

    @property
    def nbytes(self) -> int:
        return sum(int(v.tensor_size_in_bytes()) for v in self.values.values())

    def bind(self, binding: ort.IOBinding) -> dict[str, int]:
        """Bind every past tensor as is; returns each one's address."""
        for past, value in self.values.items():
            binding.bind_ortvalue_input(past, value)
        return {past: value.data_ptr() for past, value in self.values.items()}

    def take(self, outputs: dict[str, ort.OrtValue], move: bool = False) -> None:
        """Make a step's present outputs the cache. ``move``: as a plan that moves the cache to
        another processor would, through host memory (each tensor copied, and counted)."""
        for past, present in self.names:
            value = outputs[present]
            self.counts.handoffs += 1
            if move:
                # numpy() of a CPU value is a view: copy it, as a move to another memory would.
                host = np.array(value.numpy(), copy=True)
                value = ort.OrtValue.ortvalue_from_numpy(host, self.device)
            self.values[past] = value

    def check_bound(self, bound: dict[str, int], previous: dict[str, int]) -> None:
        """Count the tensors bound at a step in another buffer than the previous step returned."""
        for past, present in self.names:
            if present in previous and bound[past] != previous[present]:
                self.counts.copies += 1
                self.counts.copied_nbytes += int(self.values[past].tensor_size_in_bytes())
