"""How long :func:`edgesplit.workflows.refit.refit` measures and when it stops: the defaults that
``edgesplit refit`` shows and the Python API takes, in a module light enough for the command line
to import before it parses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RefitRounds:
    """Measured runs per bundle and round, runs first (not measured), rounds at most, and the
    share of its measurement within which every prediction must fall to stop early."""

    runs: int = 30
    warmup: int = 5
    max_rounds: int = 3
    tolerance: float = 0.05
