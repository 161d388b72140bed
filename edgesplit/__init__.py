"""edgesplit: split a neural network across the processors of an edge device and a server.

The public API follows the pipeline: load a model, describe a device, profile (here or over
SSH), partition, compile, run. Names are resolved on first use from the table below, so that
``import edgesplit`` stays cheap and importing one stage (say ``edgesplit.optimize``, which
must stay pure) does not drag in the stages to its right.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it, grouped by pipeline stage
_EXPORTS: dict[str, str] = {
    # model
    "load_model": "edgesplit.model.load",
    "ModelGraph": "edgesplit.model.graph",
    "Node": "edgesplit.model.graph",
    "TensorInfo": "edgesplit.model.graph",
    "zoo_save": "edgesplit.model.zoo",
    # devices
    "load_device": "edgesplit.device.spec",
    "load_links": "edgesplit.device.spec",
    "DeviceSpec": "edgesplit.device.spec",
    "Processor": "edgesplit.device.spec",
    "NetworkLink": "edgesplit.device.spec",
    # profiles
    "profile_model": "edgesplit.profile.run",
    "ProfileOptions": "edgesplit.profile.options",
    "RemoteOptions": "edgesplit.profile.remote",
    "profile_remote": "edgesplit.profile.remote",
    "profile_fleet": "edgesplit.profile.fleet",
    "detect_remote": "edgesplit.profile.remote",
    "Profile": "edgesplit.profile.store",
    "ProcessorProfile": "edgesplit.profile.store",
    "NodeCost": "edgesplit.profile.store",
    "load_profile": "edgesplit.profile.store",
    # precision
    "AccuracyBudget": "edgesplit.precision.metrics",
    "Accuracy": "edgesplit.precision.metrics",
    "calibration_set": "edgesplit.model.calibration_data",
    "bundle_accuracy": "edgesplit.runtime.accuracy",
    # partition
    "partition": "edgesplit.workflows.resolve",
    "Plan": "edgesplit.optimize",
    "load_plan": "edgesplit.optimize",
    # compile and run
    "compile_bundle": "edgesplit.workflows.compile",
    "open_bundle": "edgesplit.bundle.format",
    "Manifest": "edgesplit.bundle.format",
    "PartArtifact": "edgesplit.bundle.format",
    "load": "edgesplit.runtime.session",
    "Session": "edgesplit.runtime.session",
    "SessionStats": "edgesplit.runtime.session",
    "Trace": "edgesplit.runtime.trace",
    "PartRun": "edgesplit.runtime.trace",
    "RequestRun": "edgesplit.runtime.trace",
    "Breakdown": "edgesplit.runtime.breakdown",
    "write_chrome_trace": "edgesplit.runtime.chrome",
    "deploy": "edgesplit.workflows.deploy",
    "Verification": "edgesplit.bundle.verdict",
    "MeasuredCandidate": "edgesplit.bundle.verdict",
    "VerifyOptions": "edgesplit.workflows.verify.ship",
    "verify_plan": "edgesplit.workflows.verify.ship",
    # stage time limits
    "StageLimits": "edgesplit.limits",
    "stage_limits": "edgesplit.limits",
    "StageTimeout": "edgesplit.limits",
    # errors
    "EdgesplitError": "edgesplit.errors",
    "InputError": "edgesplit.errors",
    "ModelLoadError": "edgesplit.errors",
    "DeviceSpecError": "edgesplit.errors",
    "ProfileError": "edgesplit.errors",
    "PlanError": "edgesplit.errors",
    "BundleError": "edgesplit.errors",
    "RunInputError": "edgesplit.errors",
    "RemoteError": "edgesplit.errors",
    "RemoteHostError": "edgesplit.errors",
    "CompileError": "edgesplit.errors",
}
_ALIASES = {"zoo_save": "save"}

__all__ = list(_EXPORTS)  # and ``__version__``, resolved on first use like the rest


def _version() -> str:
    """The installed distribution's version: pyproject.toml's ``version``, the one source."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("edgesplit")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edgesplit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})


if TYPE_CHECKING:  # for type checkers and IDEs; at run time the table above is used
    from edgesplit.bundle.format import Manifest, PartArtifact, open_bundle
    from edgesplit.bundle.verdict import MeasuredCandidate, Verification
    from edgesplit.device.spec import DeviceSpec, NetworkLink, Processor, load_device, load_links
    from edgesplit.errors import (
        BundleError,
        CompileError,
        DeviceSpecError,
        EdgesplitError,
        InputError,
        ModelLoadError,
        PlanError,
        ProfileError,
        RemoteError,
        RemoteHostError,
        RunInputError,
    )
    from edgesplit.limits import StageLimits, StageTimeout, stage_limits
    from edgesplit.model.calibration_data import calibration_set
    from edgesplit.model.graph import ModelGraph, Node, TensorInfo
    from edgesplit.model.load import load_model
    from edgesplit.model.zoo import save as zoo_save
    from edgesplit.optimize import Plan, load_plan
    from edgesplit.precision.metrics import Accuracy, AccuracyBudget
    from edgesplit.profile.fleet import profile_fleet
    from edgesplit.profile.options import ProfileOptions
    from edgesplit.profile.remote import RemoteOptions, detect_remote, profile_remote
    from edgesplit.profile.run import profile_model
    from edgesplit.profile.store import NodeCost, ProcessorProfile, Profile, load_profile
    from edgesplit.runtime.accuracy import bundle_accuracy
    from edgesplit.runtime.breakdown import Breakdown
    from edgesplit.runtime.chrome import write_chrome_trace
    from edgesplit.runtime.session import Session, SessionStats, load
    from edgesplit.runtime.trace import PartRun, RequestRun, Trace
    from edgesplit.workflows.compile import compile_bundle
    from edgesplit.workflows.deploy import deploy
    from edgesplit.workflows.resolve import partition
    from edgesplit.workflows.verify.ship import VerifyOptions, verify_plan
