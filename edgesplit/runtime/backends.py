"""The executor table: what runs each part of a bundle, keyed by backend name.

A part with ``remote=True`` runs under ``remote`` (an OIP v2 client, whose local fallback is
built from this same table); any other part under its own backend. A new backend adds one line
here (and one in ``device/schema.py: BACKENDS``, ``profile/backends.py`` and
``compile/backends.py``);
tests may add an entry at run time and remove it after.

Kept apart from :mod:`edgesplit.runtime.executors` and :mod:`edgesplit.runtime.remote` so that
neither imports the other: this module imports both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from edgesplit.backends.ort.executor import OrtExecutor
from edgesplit.backends.tvm.executor import TvmExecutor
from edgesplit.bundle.format import PartArtifact
from edgesplit.errors import BundleError
from edgesplit.runtime.executors import Executor
from edgesplit.runtime.remote import RemoteExecutor

# factory(part, bundle_dir, *, shares_processor=False, **options) -> Executor; ``options`` are
# the caller's for that backend (``load(bundle, executor_options={"ort": {...}})``).
ExecutorFactory = Callable[..., Executor]


def fallback_executor(part: PartArtifact, bundle: Path) -> Executor | None:
    """What runs a remote part on the device when the server cannot: its ``fallback`` artifact on
    a device CPU, by the fallback's own backend; None when the part has none."""
    fb = part.fallback
    factory = EXECUTORS.get(fb.get("backend", "ort")) if fb and fb.get("file") else None
    if fb is None or factory is None:
        return None
    # The part's threads, cores and provider describe the server's processor, not the device's.
    local_part = dataclasses.replace(
        part,
        backend=fb.get("backend", "ort"),
        file=fb["file"],
        onnx_file=fb["file"],
        threads=fb.get("threads"),
        cores=None,
        provider="CPUExecutionProvider",
        provider_options={},
        remote=False,
    )
    return factory(local_part, bundle)


def remote_executor(
    part: PartArtifact,
    bundle: Path,
    *,
    fallback: bool = True,
    shares_processor: bool = False,
    **options,
) -> Executor:
    """A :class:`RemoteExecutor` with its local fallback (unless ``fallback=False``)."""
    return RemoteExecutor(
        part, local=fallback_executor(part, bundle) if fallback else None, **options
    )


def artifact_executor(part: PartArtifact, bundle: Path, **options) -> Executor:
    """ORT on the part's artifact (``file``: its int8 QDQ or fp16 model), not its fp32 ONNX file."""
    return OrtExecutor(part, bundle, file=part.file, **options)


EXECUTORS: dict[str, ExecutorFactory] = {
    "ort": OrtExecutor,
    "tvm": TvmExecutor,
    "remote": remote_executor,
    "ort-int8": artifact_executor,
    "ort-fp16": artifact_executor,
}


def make_executor(part: PartArtifact, bundle: Path, **options) -> Executor:
    """The executor for ``part``: ``remote`` for a server part, else its backend's.

    Raises:
        BundleError: for a backend with no executor here.
    """
    factory = EXECUTORS.get("remote" if part.remote else part.backend)
    if factory is None:
        raise BundleError(
            f"part {part.name}: no executor for backend '{part.backend}' (executors: "
            f"{', '.join(EXECUTORS)})"
        )
    return factory(part, bundle, **options)
