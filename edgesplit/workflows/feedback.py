"""What a long workflow tells its caller while it runs (:class:`Feedback`): the command line draws
the progress and prints the notes; a caller that passes nothing hears nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgesplit.util import Progress

__all__ = ["SILENT", "Feedback"]


@dataclass(frozen=True)
class Feedback:
    """Where a workflow reports as it goes (each part optional).

    Attributes:
        progress: Told ``(label, done, total)`` as long work goes on (profiling, compiling).
        on_note: Told each note as it comes: what loading the model changed, a choice made.
    """

    progress: Progress | None = None
    on_note: Callable[[str], None] | None = None


SILENT = Feedback()
"""No progress and no notes: the default of every workflow that takes a :class:`Feedback`."""
