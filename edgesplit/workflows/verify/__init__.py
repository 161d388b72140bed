"""Verification by measurement: a plan against the best baselines, on the target itself.

The stage after the runtime (it compiles candidates and runs them in real Sessions) and before the
CLI. ``deploy`` and ``compile --verify`` call :func:`verify_plan`; the verdict is recorded in the
bundle's manifest as a :class:`~edgesplit.bundle.verdict.Verification`.
"""

from __future__ import annotations

from edgesplit.bundle.verdict import MeasuredCandidate, Verification
from edgesplit.workflows.verify.decide import metric_for
from edgesplit.workflows.verify.ship import VerifyOptions, local_server, verify_plan

__all__ = [
    "MeasuredCandidate",
    "Verification",
    "VerifyOptions",
    "local_server",
    "metric_for",
    "verify_plan",
]
