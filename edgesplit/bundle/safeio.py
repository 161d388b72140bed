"""Reading a bundle's files as the bytes that were checked: no symlinks, no special files, no
second look by path.

A bundle is read through file descriptors: every path component is opened relative to the one
before it with ``O_NOFOLLOW`` (so no symlink anywhere inside the bundle is followed) and the file
is checked with ``fstat`` to be a regular file (``O_NONBLOCK``: a FIFO is refused, not waited on).
What is hashed is what is then used: :func:`read_checked` returns the bytes it hashed, and
:func:`copy_checked` copies a file into a private folder while hashing the bytes it writes, so a
native library is loaded from a copy nobody else can change (time of check = time of use).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from edgesplit.errors import BundleError

_CHUNK = 1 << 20


def check_relpath(rel: object, source: str) -> str:
    """A path inside the bundle: relative, ``/``-separated, without ``..``, ``.`` or empty parts."""
    if not isinstance(rel, str) or not rel:
        raise BundleError(f"{source}: file path {rel!r:.60} is not a relative path")
    parts = rel.split("/")
    if (
        PurePosixPath(rel).is_absolute()
        or "\\" in rel
        or "\0" in rel
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise BundleError(f"{source}: file path {rel!r:.80} leaves the bundle")
    return rel


def open_regular(root: Path, rel: str) -> int:
    """A read-only descriptor of the regular file ``rel`` under ``root``; no component may be a
    symbolic link (``root`` itself may be). The caller closes it.

    Raises:
        BundleError: naming the file: missing, a symbolic link, or not a regular file.
    """
    check_relpath(rel, str(root))
    path = root / rel
    parts = rel.split("/")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise BundleError(f"{root}: cannot open the bundle directory ({e.strerror})") from e
    try:
        for name in parts[:-1]:
            nxt = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = nxt
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        out = os.open(parts[-1], flags, dir_fd=fd)
    except FileNotFoundError:
        raise BundleError(f"{path}: missing from the bundle") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise BundleError(
                f"{_first_link(root, parts)}: a symbolic link (a bundle holds only regular files)"
            ) from None
        raise BundleError(f"{path}: cannot read ({e.strerror})") from e
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise BundleError(f"{path}: not a regular file (a bundle holds only regular files)")
    return out


def _first_link(root: Path, parts: list[str]) -> Path:
    """The first component of ``root/parts`` that is a symlink (or not a folder), for the
    message."""
    p = root
    for name in parts:
        p = p / name
        if p.is_symlink() or not p.is_dir():
            return p
    return p


def _mismatch(path: Path) -> BundleError:
    return BundleError(f"{path}: checksum mismatch (the file was changed after compile)")


def read_checked(
    root: Path, rel: str, sha256: str | None, *, max_nbytes: int | None = None
) -> bytes:
    """The bytes of ``rel``, read once through one descriptor, and checked against ``sha256``
    (None: not checked, for the manifest itself, whose check is its signature).

    Raises:
        BundleError: see :func:`open_regular`; a checksum mismatch; a file over ``max_nbytes``.
    """
    fd = open_regular(root, rel)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if max_nbytes is not None and size > max_nbytes:
            raise BundleError(
                f"{root / rel}: {size:,} bytes, more than it may hold ({max_nbytes:,})"
            )
        data = f.read() if max_nbytes is None else f.read(max_nbytes + 1)
    if max_nbytes is not None and len(data) > max_nbytes:
        raise BundleError(f"{root / rel}: more than {max_nbytes:,} bytes, more than it may hold")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise _mismatch(root / rel)
    return data


def hash_checked(root: Path, rel: str, sha256: str) -> None:
    """Check ``rel`` against ``sha256`` without keeping its bytes (see :func:`open_regular`)."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(root, rel), "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    if h.hexdigest() != sha256:
        raise _mismatch(root / rel)


@contextlib.contextmanager
def copy_checked(root: Path, rel: str, sha256: str) -> Iterator[Path]:
    """A private copy of ``rel`` whose bytes match ``sha256``, removed when the block ends.

    The copy is made through one descriptor into a new ``0700`` folder, hashing the bytes as they
    are written; it is what the caller loads (a shared library stays mapped after its file is
    removed). Nothing but this user can change the copy between the check and the load.
    """
    src = open_regular(root, rel)
    folder = Path(tempfile.mkdtemp(prefix="edgesplit-verified-"))  # mode 0700
    try:
        copy = folder / PurePosixPath(rel).name
        h = hashlib.sha256()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(src, "rb") as f, os.fdopen(os.open(copy, flags, 0o600), "wb") as out:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise _mismatch(root / rel)
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)
