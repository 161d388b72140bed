"""What a profile measures and for how long (:class:`ProfileOptions`): the same options here, over
SSH and on a fleet. Light to import: the command line builds its ``--backend``, ``--processor``,
``--runs`` and ``--warmup`` group from it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from edgesplit.errors import InputError


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """What to profile and for how long; the same options locally, over SSH and on a fleet.

    Attributes:
        backends: Only these backends (``ort``, ``tvm`` ...); None: every one the device offers.
        processors: Only these processors; None: all.
        runs: Timed runs per measurement (median and p90 are over these).
        warmup: Untimed runs first.

    Raises:
        InputError: for an unknown backend name, fewer than 1 run or a negative warm-up.
    """

    backends: tuple[str, ...] | None = None
    processors: tuple[str, ...] | None = None
    runs: int = 20
    warmup: int = 5

    def __post_init__(self) -> None:
        from edgesplit.device.spec import BACKENDS

        for name in ("backends", "processors"):
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(value) if value else None)
        unknown = [b for b in self.backends or () if b not in BACKENDS]
        if unknown:
            raise InputError(f"unknown backend '{unknown[0]}' (backends: {', '.join(BACKENDS)})")
        if self.runs < 1 or self.warmup < 0:
            raise InputError(
                f"runs must be at least 1 and warmup at least 0, got {self.runs} and {self.warmup}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ProfileOptions:
        from edgesplit.util import known_fields

        return ProfileOptions(**known_fields(ProfileOptions, d))
