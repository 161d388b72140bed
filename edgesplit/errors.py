"""One error hierarchy for edgesplit.

Every error the user can cause is an :class:`InputError` (CLI exit code 2); everything that
fails while running is an :class:`EdgesplitError` (exit code 1). Messages are one line and name
the file or host they are about, so the CLI prints them as they are.

Remote hosts follow the same rule. A host or server the user named that cannot be used at all
(it cannot be resolved or reached, refuses the connection, fails the host-key or authentication
check, lacks the Python the agent needs) is bad input: :class:`RemoteHostError`, exit code 2.
A connection that breaks off, times out or fails once the work has started is a failure while
running: :class:`RemoteError`, exit code 1.
"""

from __future__ import annotations


class EdgesplitError(Exception):
    """Root of all edgesplit errors. The CLI exits with :attr:`exit_code`."""

    exit_code = 1


class InputError(EdgesplitError):
    """Bad input from the user: a file, a flag, a spec. The CLI exits with 2."""

    exit_code = 2


class ModelLoadError(InputError):
    """An ONNX model that cannot be loaded; lists every problem found at once."""

    def __init__(self, path: str, problems: list[str] | str):
        self.path = str(path)
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(f"{self.path}: " + "; ".join(self.problems))


class DeviceSpecError(InputError):
    """A device spec (YAML) that is malformed or names something unknown."""


class ProfileError(InputError):
    """A profile file that is malformed or belongs to another model or device."""


class PlanError(InputError):
    """A plan that cannot be made or does not fit the model (unsupported ops, impossible SLO...)."""


class BundleError(InputError):
    """A bundle that is corrupt, tampered with, or of another format version."""


class RunInputError(InputError):
    """Inputs given to a session whose names, shapes or dtypes do not match the model."""


class RemoteError(EdgesplitError):
    """A remote host or server that broke off, timed out or failed while working. Exit code 1."""


class RemoteHostError(RemoteError, InputError):
    """A host or server the user named that cannot be used: unknown, unreachable, refusing us,
    failing the host-key or authentication check, or lacking what the agent needs. Exit code 2.

    It is a :class:`RemoteError` too, so callers that retry or fall back on remote failures
    treat it alike.
    """

    exit_code = 2


class CompileError(EdgesplitError):
    """A part that could not be compiled for its target (a missing toolchain, say)."""
