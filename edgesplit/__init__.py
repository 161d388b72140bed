"""edgesplit: split a neural network across the processors of an edge device and a server.

The public API follows the pipeline: load a model, describe a device, profile, partition,
compile, run.
"""

from __future__ import annotations

from edgesplit.compile.api import compile_bundle
from edgesplit.compile.bundle import Manifest, PartArtifact, open_bundle
from edgesplit.deploy import deploy
from edgesplit.device import DeviceSpec, NetworkLink, Processor, load_device, load_links
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
    RunInputError,
)
from edgesplit.model.graph import ModelGraph, Node, TensorInfo
from edgesplit.model.load import load_model
from edgesplit.profile.store import NodeCost, ProcessorProfile, Profile, load_profile

__all__ = [
    # model
    "load_model",
    "ModelGraph",
    "Node",
    "TensorInfo",
    # devices
    "load_device",
    "load_links",
    "DeviceSpec",
    "Processor",
    "NetworkLink",
    # profiles
    "Profile",
    "ProcessorProfile",
    "NodeCost",
    "load_profile",
    "profile_model",
    # compile and run
    "compile_bundle",
    "open_bundle",
    "Manifest",
    "PartArtifact",
    "load",
    "Session",
    "SessionStats",
    "deploy",
    "zoo_save",
    # errors
    "EdgesplitError",
    "InputError",
    "ModelLoadError",
    "DeviceSpecError",
    "ProfileError",
    "PlanError",
    "BundleError",
    "RunInputError",
    "RemoteError",
    "CompileError",
]
