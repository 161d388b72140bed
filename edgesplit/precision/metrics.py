"""Accuracy of a reduced-precision model against fp32, and the budget a plan must meet.

Pure numpy (``optimize/`` imports it). Figures compare a plan's outputs with the fp32 model's on
the same held-out samples; there are no labels, so "accuracy" is agreement with fp32 (each figure
is defined on its field of :class:`Accuracy`).

``drop`` is one number for both kinds of model: the share of samples whose top-1 class changed
for a classifier, else the relative RMS error ``10 ** (-snr_db / 20)`` (0.01 is 40 dB).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgesplit.precision import CALIBRATION_METHODS

SNR_CAP_DB = 200.0


@dataclass(frozen=True)
class Accuracy:
    """How close a reduced-precision run is to fp32, on held-out samples (no labels: agreement)."""

    snr_db: float
    """10 log10(sum ref^2 / sum (ref - got)^2) over every output element of every sample, the
    worst output counted (capped at :data:`SNR_CAP_DB`, which means equal to rounding)."""
    cosine: float
    """Cosine similarity of the flattened outputs, the worst output counted."""
    max_abs_error: float
    """The largest absolute difference anywhere."""
    top1_agreement: float | None = None
    """For classifiers (an output of shape ``(N, C)`` with ``C >= 2``), the share of samples whose
    arg-max class is fp32's; None for other models."""
    samples: int = 0
    """How many held-out samples the figures are over (0 in :data:`EXACT`: nothing was run)."""

    @property
    def drop(self) -> float:
        """Top-1 classes changed (classifiers), else the relative RMS error."""
        if self.top1_agreement is not None:
            return 1.0 - self.top1_agreement
        return 10.0 ** (-self.snr_db / 20.0)

    @property
    def noise(self) -> float:
        """Noise power over signal power, plus top-1 changes: what one part adds to a plan."""
        changed = 1.0 - self.top1_agreement if self.top1_agreement is not None else 0.0
        return 10.0 ** (-self.snr_db / 10.0) + changed

    def summary(self) -> str:
        top1 = f", top-1 {self.top1_agreement:.1%}" if self.top1_agreement is not None else ""
        return (
            f"SNR {self.snr_db:.1f} dB, cosine {self.cosine:.5f}, max abs err "
            f"{self.max_abs_error:.3g}{top1}"
        )

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Accuracy:
        from edgesplit.util import known_fields

        return Accuracy(**known_fields(Accuracy, d))


EXACT = Accuracy(SNR_CAP_DB, 1.0, 0.0, None, 0)
"""What an all-fp32 plan has: its parts reproduce the model (compile checks them)."""


@dataclass(frozen=True)
class AccuracyBudget:
    """The least accuracy a plan with reduced-precision parts must keep; None fields are unchecked.

    Attributes:
        min_snr_db: Every output's SNR against fp32, in dB.
        min_top1_agreement: For classifiers, the share of samples keeping fp32's class (0-1).
        max_accuracy_drop: :attr:`Accuracy.drop` at most this (0-1).
    """

    min_snr_db: float | None = None
    min_top1_agreement: float | None = None
    max_accuracy_drop: float | None = None

    def misses(self, acc: Accuracy) -> list[str]:
        """Why ``acc`` misses the budget (empty when it meets it)."""
        out = []
        if self.min_snr_db is not None and acc.snr_db < self.min_snr_db:
            out.append(f"SNR {acc.snr_db:.1f} dB < {self.min_snr_db:g} dB")
        if (
            self.min_top1_agreement is not None
            and acc.top1_agreement is not None
            and acc.top1_agreement < self.min_top1_agreement
        ):
            out.append(f"top-1 agreement {acc.top1_agreement:.1%} < {self.min_top1_agreement:.1%}")
        if self.max_accuracy_drop is not None and acc.drop > self.max_accuracy_drop:
            out.append(f"accuracy drop {acc.drop:.2%} > {self.max_accuracy_drop:.2%}")
        return out

    def meets(self, acc: Accuracy) -> bool:
        return not self.misses(acc)

    def summary(self) -> str:
        parts = []
        if self.min_snr_db is not None:
            parts.append(f"SNR >= {self.min_snr_db:g} dB")
        if self.min_top1_agreement is not None:
            parts.append(f"top-1 agreement >= {self.min_top1_agreement:.1%}")
        if self.max_accuracy_drop is not None:
            parts.append(f"drop <= {self.max_accuracy_drop:.2%}")
        return ", ".join(parts) or "none"

    def to_json(self) -> dict[str, Any]:
        from edgesplit.util import present_fields

        return present_fields(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AccuracyBudget:
        from edgesplit.util import known_fields

        return AccuracyBudget(**known_fields(AccuracyBudget, d))


def check_figures(cls: type, value: Any, where: str, error: type[Exception]) -> None:
    """``value`` read from a file as an :class:`Accuracy` or :class:`AccuracyBudget` (``cls``): an
    object with its keys, of their types, and finite numbers.

    Raises:
        error: naming ``where`` and the key at fault.
    """
    from edgesplit.util import check_fields, known_fields, short

    if not isinstance(value, Mapping):
        raise error(f"{where}: expected an object, got {short(value, 40)}")
    try:
        obj = cls(**known_fields(cls, value))
    except KeyError as e:
        raise error(f"{where}: missing key {e}") from None
    check_fields(obj, where, error, signed=("snr_db", "cosine", "min_snr_db"))


def check_record(record: Any, source: str, error: type[Exception]) -> None:
    """A plan's ``accuracy`` record read from a file (see :attr:`edgesplit.optimize.Plan.accuracy`):
    an object whose ``budget``, ``measured`` and ``parts`` figures have their types and finite
    numbers, and whose ``calibration.path``, which compile and :func:`bundle_accuracy` read data
    from, is a string. The rest is only printed.

    Raises:
        error: naming ``source`` and the key at fault.
    """
    from edgesplit.util import short

    def figures(cls: type, value: Any, where: str) -> None:
        check_figures(cls, value, where, error)

    if not isinstance(record, Mapping):
        raise error(f"{source}: expected an object or null, got {short(record, 40)}")
    for key, value in record.items():
        if key == "budget":
            figures(AccuracyBudget, value, f"{source}.budget")
        elif key == "measured":
            figures(Accuracy, value, f"{source}.measured")
        elif key == "parts" and isinstance(value, Mapping):
            for name, fig in value.items():
                figures(Accuracy, fig, f"{source}.parts.{short(name, 40)}")
        elif key in ("parts", "calibration", "dropped") and not isinstance(
            value, Mapping if key != "dropped" else list
        ):
            raise error(f"{source}.{key}: expected {'a list' if key == 'dropped' else 'an object'}")
        if key == "calibration" and not isinstance(value.get("path", ""), str):
            raise error(
                f"{source}.calibration.path: expected a string, got {short(value['path'], 40)}"
            )
        if (
            key == "calibration"
            and value.get("method", CALIBRATION_METHODS[0]) not in CALIBRATION_METHODS
        ):
            raise error(
                f"{source}.calibration.method: expected one of {', '.join(CALIBRATION_METHODS)}, "
                f"got {short(value['method'], 40)}"
            )


DEFAULT_BUDGET = AccuracyBudget(max_accuracy_drop=0.01)
"""With no budget given: 1% of top-1 classes changed, or 1% relative RMS error (40 dB)."""


def is_classifier(shape: Sequence[int]) -> bool:
    """Logits or probabilities of one class per sample: ``(N, C)`` with ``C >= 2``."""
    return len(shape) == 2 and shape[1] >= 2


def _snr_db(ref: np.ndarray, err: np.ndarray) -> float:
    signal, noise = float(np.sum(ref * ref)), float(np.sum(err * err))
    if noise == 0.0:
        return SNR_CAP_DB
    if signal == 0.0:
        return -SNR_CAP_DB
    return max(-SNR_CAP_DB, min(SNR_CAP_DB, 10.0 * math.log10(signal / noise)))


def _cosine(ref: np.ndarray, got: np.ndarray) -> float:
    den = float(np.linalg.norm(ref) * np.linalg.norm(got))
    return float(np.dot(ref, got) / den) if den > 0 else float(np.array_equal(ref, got))


def compare(
    reference: Sequence[Mapping[str, np.ndarray]], got: Sequence[Mapping[str, np.ndarray]]
) -> Accuracy:
    """The figures of ``got`` against ``reference``: one mapping of outputs per sample, same
    keys."""
    if not reference:
        return EXACT
    snr, cos, worst, top1 = SNR_CAP_DB, 1.0, 0.0, None
    for name in reference[0]:
        ref = np.stack([np.asarray(r[name], dtype=np.float64) for r in reference])
        out = np.stack([np.asarray(g[name], dtype=np.float64) for g in got])
        err = out - ref
        snr = min(snr, _snr_db(ref, err))
        cos = min(cos, _cosine(ref.ravel(), out.ravel()))
        worst = max(worst, float(np.max(np.abs(err))) if err.size else 0.0)
        if is_classifier(reference[0][name].shape):
            same = float(np.mean(ref.argmax(axis=-1) == out.argmax(axis=-1)))
            top1 = same if top1 is None else min(top1, same)
    return Accuracy(snr, cos, worst, top1, len(reference))
