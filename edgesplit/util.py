"""Small helpers shared by every stage: atomic writes, hashing, strict JSON readers and writers,
checks of the numbers and names read from files, the rule for replacing an output folder, the
data files edgesplit ships."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

Progress = Callable[[str, int, int], None]
"""Told ``(label, done, total)`` as long work goes on (profiling, tuning, compiling, measuring);
the command line draws one bar per label (``cli.common.progress_bar``)."""

MAX_JSON_NBYTES = 256 << 20
"""Largest JSON file read (plans, profiles, manifests): far above any real one, far below memory."""


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


def read_file_bytes(
    path: str | os.PathLike, error: type[Exception], what: str, *, max_nbytes: int = MAX_JSON_NBYTES
) -> bytes:
    """The bytes of a regular file of at most ``max_nbytes``; ``error`` names the file and the
    problem.

    Opened without blocking (a FIFO is refused, not waited on) and checked with ``fstat``.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{p}: no such {what} file") from None
    except OSError as e:
        raise error(f"{p}: cannot read the {what} ({e.strerror})") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{p}: is a directory, not a {what} file")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{p}: not a regular file (a {what} must be one)")
        if st.st_size > max_nbytes:
            raise error(f"{p}: {st.st_size:,} bytes, more than a {what} may hold ({max_nbytes:,})")
        try:
            data = f.read(max_nbytes + 1)
        except OSError as e:
            raise error(f"{p}: cannot read the {what} ({e.strerror})") from e
    if len(data) > max_nbytes:
        raise error(f"{p}: more than {max_nbytes:,} bytes, more than a {what} may hold")
    return data


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text} is not a finite number")
    return v


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json_object(
    raw: bytes | str, source: str | os.PathLike, error: type[Exception], what: str
) -> dict:
    """Strict JSON whose top level is an object: NaN, Infinity and numbers out of range are refused,
    and so is nesting too deep to read (one-line errors naming ``source``)."""
    try:
        data = json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:
        raise error(f"{source}: not a JSON {what} (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise error(f"{source}: not a JSON {what} ({short(str(e), 200)})") from e
    if not isinstance(data, dict):
        raise error(f"{source}: not a JSON {what} (top level is {type(data).__name__})")
    return data


def read_json_object(
    path: str | os.PathLike, error: type[Exception], what: str, *, max_nbytes: int = MAX_JSON_NBYTES
) -> dict:
    """A JSON file whose top level is an object; ``error`` names the file and the problem.

    See :func:`read_file_bytes` (size, file type) and :func:`parse_json_object` (strict numbers).
    """
    return parse_json_object(
        read_file_bytes(path, error, what, max_nbytes=max_nbytes), path, error, what
    )


def dump_json(data: Any, *, indent: int | None = 1) -> str:
    """JSON text with a final newline; a NaN or infinity is a ValueError, never ``NaN`` in a
    file."""
    return json.dumps(data, indent=indent, allow_nan=False) + "\n"


def write_json(path: str | os.PathLike, data: Any, what: str) -> None:
    """Write ``data`` as JSON atomically; a non-finite number is refused, naming the file."""
    from edgesplit.errors import EdgesplitError

    try:
        text = dump_json(data)
    except ValueError as e:
        raise EdgesplitError(
            f"{path}: refusing to write the {what}: it holds a non-finite number ({e})"
        ) from e
    atomic_write_text(path, text)


def short(value: Any, limit: int = 80) -> str:
    """``value`` as text for an error message, at most about ``limit`` characters.

    Never builds the whole ``repr`` of a large value (a string is cut, containers are elided).
    """
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[: limit - 20]}... ({len(value):,} chars)"
    import reprlib

    r = reprlib.Repr()  # Python 3.11's takes no keyword arguments
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 2, limit // 2, limit // 2, limit // 2
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: Any) -> str:
    """A value in a type error: strings quoted, so ``"3"`` is told apart from ``3``."""
    return short(repr(value) if isinstance(value, str) else value, 40)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def check_identifier(name: Any, what: str, error: type[Exception]) -> str:
    """``name`` as a file-safe identifier (a letter or ``_``, then letters, digits, ``_``, ``-``;
    at most 64): what part names must be, since they become file names and URL paths."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise error(
            f"{what}: {short(name, 60)} is not a valid name (letters, digits, _ and -, starting "
            "with a "
            "letter or _, at most 64)"
        )
    return name


def check_number(
    value: Any, where: str, error: type[Exception], *, integer: bool = False, signed: bool = False
) -> None:
    """A finite number (an int if ``integer``; not a bool), non-negative unless ``signed``."""
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        raise error(
            f"{where}: expected {'an integer' if integer else 'a number'}, got {_show(value)}"
        )
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    if not finite:
        raise error(f"{where}: {short(value, 40)} is not a finite number")
    if not signed and value < 0:
        raise error(f"{where}: {short(value, 40)} is negative")


def _hint_kind(hint: Any) -> tuple[Any, Any, bool] | None:
    """``(container, element, optional)`` for the field types :func:`check_fields` checks, else
    None."""
    import types
    import typing

    origin, args, optional = typing.get_origin(hint), typing.get_args(hint), False
    if origin in (types.UnionType, typing.Union):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return None
        optional, hint = len(rest) < len(args), rest[0]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    scalars = (str, bool, int, float)
    if hint in scalars:
        return None, hint, optional
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in scalars:
        return tuple, args[0], optional
    if origin in (Mapping, dict) and len(args) == 2 and args[0] is str and args[1] in scalars:
        return Mapping, args[1], optional
    return None


_HINTS: dict[type, dict[str, tuple[Any, Any, bool]]] = {}


def _checked_fields(cls: type) -> dict[str, tuple[Any, Any, bool]]:
    if cls not in _HINTS:
        import typing

        hints = typing.get_type_hints(cls)
        kinds = {name: _hint_kind(hints[name]) for name in cls.__dataclass_fields__}
        _HINTS[cls] = {k: v for k, v in kinds.items() if v is not None}
    return _HINTS[cls]


def _check_scalar(value: Any, kind: type, where: str, error: type[Exception], signed: bool) -> None:
    if kind is float or kind is int:
        check_number(value, where, error, integer=kind is int, signed=signed)
    elif not isinstance(value, kind):
        raise error(
            f"{where}: expected {'true or false' if kind is bool else 'a string'}, got "
            f"{short(value, 40)}"
        )


def check_fields(
    obj: Any, where: str, error: type[Exception], *, signed: Collection[str] = ()
) -> None:
    """Check a dataclass read from a file against its annotations, so that nothing later trips on
    it.

    Fields annotated ``str``, ``bool``, ``int`` or ``float`` (optionally ``| None``), tuples of
    those (``tuple[int, ...]``) and mappings from ``str`` to them are checked: the type, and every
    number finite and non-negative unless the field is in ``signed``. Other fields are left to the
    caller. A field added to a dataclass is checked with no more code.

    Raises:
        error: naming ``where``, the field and the value (cut short).
    """
    for name, (container, kind, optional) in _checked_fields(type(obj)).items():
        value, at, neg = getattr(obj, name), f"{where}: {name}", name in signed
        if value is None and optional:
            continue
        if container is None:
            _check_scalar(value, kind, at, error, neg)
        elif container is tuple:
            if not isinstance(value, tuple | list):
                raise error(f"{at}: expected a list, got {short(value, 40)}")
            for i, v in enumerate(value):
                _check_scalar(v, kind, f"{at}[{i}]", error, neg)
        else:
            if not isinstance(value, Mapping):
                raise error(f"{at}: expected an object, got {short(value, 40)}")
            for k, v in value.items():
                _check_scalar(v, kind, f"{at}.{short(k, 40)}", error, neg)


def refuse_to_replace(
    path: str | os.PathLike,
    *,
    force: bool,
    ours: Callable[[Path], bool],
    what: str,
    error: type[Exception],
) -> None:
    """The rule for an output folder that exists: replace it only when it is empty or one of ours
    (``ours(path)``: an edgesplit bundle, say), or when the user said ``--force``.

    Raises:
        error: naming the folder, when it holds something else.
    """
    p = Path(path)
    if force or not (p.exists() or p.is_symlink()):
        return
    if not p.is_dir():
        raise error(
            f"{p}: exists and is not a directory; choose another output or pass --force to replace "
            "it"
        )
    if not any(p.iterdir()) or ours(p):
        return
    raise error(
        f"{p}: not empty and not {what}; choose another output or pass --force to replace it (and "
        "all it holds)"
    )


class _Named(Protocol):
    @property
    def name(self) -> str: ...


NamedT = TypeVar("NamedT", bound=_Named)


def by_name(*entries: NamedT) -> dict[str, NamedT]:
    """A registry table: ``entries`` keyed by their ``name``, in the order given."""
    return {e.name: e for e in entries}


def present_fields(record: Any) -> dict[str, Any]:
    """The fields of the dataclass instance ``record`` that are not None, in field order (the key
    order of the JSON our records write)."""
    import dataclasses

    out = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return {k: v for k, v in out.items() if v is not None}


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


@contextlib.contextmanager
def reading_record(
    data: Mapping[str, Any],
    source: str,
    what: str,
    error: type[Exception],
    *,
    format_version: int,
    say_missing_key: bool = False,
) -> Iterator[None]:
    """Build a ``what`` record (a plan, a profile) from ``data`` read from ``source``, inside
    this block.

    ``data["format_version"]`` must be ``format_version``. A ``KeyError``, ``TypeError``,
    ``AttributeError`` or ``ValueError`` raised in the block becomes ``error`` ("not a valid
    ``what``", chained); with ``say_missing_key``, a ``KeyError`` reads "missing key ...". An
    ``error`` raised in the block passes through as it is.

    Raises:
        error: naming ``source``.
    """
    if data.get("format_version") != format_version:
        raise error(
            f"{source}: {what} format version {data.get('format_version')!r}, expected "
            f"{format_version}"
        )
    try:
        yield
    except error:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        if say_missing_key and isinstance(e, KeyError):
            detail = short(f"missing key {e}", 200)
        else:
            detail = f"{type(e).__name__}: {short(str(e), 200)}"
        raise error(f"{source}: not a valid {what} ({detail})") from e


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


class Closing:
    """A context manager that opens in :meth:`open` and closes in :meth:`close`; an ``open`` that
    fails closes what it had opened before the error goes on."""

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
