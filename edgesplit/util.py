"""Small helpers shared by every stage: atomic writes, hashing, tolerant JSON readers, the data
files edgesplit ships."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory in a temp sibling and rename it into place only when the block succeeds.

    An existing directory at ``path`` is replaced only after the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            _rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        _rmtree(tmp)
        raise


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json_object(path: str | os.PathLike, error: type[Exception], what: str) -> dict:
    """A JSON file whose top level is an object; ``error`` names the file and the problem."""
    import json

    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise error(f"{p}: no such {what} file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{p}: not a JSON {what} ({e})") from e
    if not isinstance(data, dict):
        raise error(f"{p}: not a JSON {what} (top level is {type(data).__name__})")
    return data


def known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The items of ``data`` whose keys are fields of the dataclass ``cls``.

    Readers of our JSON files build their dataclasses from this: a key an older writer did not
    know takes the field's default, and a key a newer writer added is left for that version, so a
    new optional field is one line in the dataclass.

    Raises:
        KeyError: naming the first field without a default that ``data`` lacks.
    """
    import dataclasses

    out = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            out[f.name] = data[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise KeyError(f.name)
    return out


SHIPPED = ("devices", "profiles")
"""The data folders edgesplit ships: top-level folders of the source tree, copied into the wheel."""


def shipped_dir(name: str) -> Path:
    """The folder of shipped data files ``name`` (one of :data:`SHIPPED`), in a wheel or a checkout.

    The files live in the top-level ``devices/`` and ``profiles/`` folders of the source tree;
    ``setup.py`` copies them into the wheel as ``edgesplit/_data/NAME/``. An installed package
    reads that copy, a source checkout (or an editable install) the top-level folder.
    """
    if name not in SHIPPED:
        raise ValueError(f"no shipped data folder {name!r} (shipped: {', '.join(SHIPPED)})")
    package = Path(__file__).resolve().parent
    installed = package / "_data" / name
    return installed if installed.is_dir() else package.parent / name
