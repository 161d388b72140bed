"""Build the self-contained agent (a zipapp, in memory) and the one remote command that runs it.

The zipapp holds the pure-Python parts of edgesplit that profiling needs (``edgesplit/*.py``,
``model/``, ``profile/``) and, under ``_vendor/`` (searched last), PyYAML's pure-Python package,
which ``edgesplit.device.spec`` imports. Its ``__main__`` installs ``edgesplit`` as a bare package
(without running ``edgesplit/__init__.py``, which imports the whole public API) and runs
:func:`edgesplit.profile.agent.main`. The remote needs only Python 3.11+ with numpy, onnx,
onnxruntime and onnxslim; the device probe needs nothing beyond the standard library.

The remote command is the only ``exec_command`` of a session. It makes a private folder with
``mktemp -d`` (mode 0700), removes it on exit by a shell trap, and runs a small bootstrap that
reads the zipapp from stdin (a length line, then the bytes) into that folder and runs it. Every
argument is quoted with :func:`shlex.quote`; user-chosen names never reach the shell.
"""

from __future__ import annotations

import functools
import hashlib
import io
import shlex
import zipfile
from collections.abc import Mapping
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # edgesplit/
SUBPACKAGES = (
    "model",
    "profile",
    "precision",
    "device",
    "backends",
)  # the int8 profiler lives in precision
_STAMP = (2020, 1, 1, 0, 0, 0)  # fixed times: the same sources give the same bytes

MAIN = """\
import os, sys, types
here = os.path.dirname(os.path.abspath(__file__))
pkg = types.ModuleType("edgesplit")
pkg.__path__ = [os.path.join(here, "edgesplit")]
pkg.__file__ = os.path.join(here, "edgesplit", "__init__.py")
sys.modules["edgesplit"] = pkg  # a bare package: its __init__ imports the whole public API
sys.path.append(os.path.join(here, "_vendor"))  # after the host's own packages
from edgesplit.profile.agent import main
sys.exit(main(sys.argv[1]))
"""

# Runs under ``python -c`` with the folder as argv[1]. No backslashes or single quotes, so it
# survives any login shell's quoting; it checks the version before using anything newer.
BOOTSTRAP = """\
import os, sys, json
d = sys.argv[1]
if sys.version_info < (3, 11):
    why = "the remote Python is %s; the agent needs Python 3.11 or newer" % sys.version.split()[0]
    sys.stdout.write(json.dumps({"event": "error", "exit_code": 2, "type": "PythonTooOld",
        "message": why}) + chr(10))
    sys.stdout.flush()
    sys.exit(3)
r = sys.stdin.buffer
n = int(r.readline())
p = os.path.join(d, "agent.pyz")
with open(p, "wb") as f:
    while n > 0:
        b = r.read(min(n, 1048576))
        if not b:
            sys.exit(4)
        f.write(b)
        n -= len(b)
sys.argv = [p, d]
import runpy
runpy.run_path(p, run_name="__main__")
"""

# $1 = python, $2 = bootstrap. The trap removes the folder however python ends (even SIGKILL).
# TMPDIR points into the folder, so what the libraries leave in their temp dirs goes with it
# (onnxruntime 1.32 writes a ``$TMPDIR/.ses`` file, for one). The first line out names the shell's
# pid and the folder, so the client can clean up even when python never starts or hangs.
SHELL = """\
umask 077
d=$(mktemp -d "${TMPDIR:-/tmp}/edgesplit-agent.XXXXXXXX") || exit 96
trap 'rm -rf "$d"' EXIT
trap 'exit 129' HUP
trap 'exit 143' TERM
trap 'exit 130' INT
cd "$d" || exit 96
TMPDIR=$d
export TMPDIR
printf 'edgesplit-agent %s %s\n' "$$" "$d"
"$1" -c "$2" "$d"
"""

HELLO = b"edgesplit-agent "
EXIT_MKTEMP = 96
EXIT_NO_PYTHON = 127


def _add(zf: zipfile.ZipFile, arcname: str, data: bytes) -> None:
    info = zipfile.ZipInfo(arcname, _STAMP)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def _sources() -> list[tuple[str, Path]]:
    files = [p for p in PACKAGE_DIR.glob("*.py")]
    for sub in SUBPACKAGES:
        files += sorted((PACKAGE_DIR / sub).rglob("*.py"))
    out = [(f"edgesplit/{p.relative_to(PACKAGE_DIR).as_posix()}", p) for p in sorted(files)]
    try:
        import yaml

        ydir = Path(yaml.__file__).resolve().parent
        out += [(f"_vendor/yaml/{p.name}", p) for p in sorted(ydir.glob("*.py"))]
    except ImportError:  # edgesplit depends on PyYAML; without it the agent cannot load either
        pass
    return out


@functools.lru_cache(maxsize=1)
def build_agent() -> bytes:
    """The agent zipapp's bytes (deterministic for the same sources)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        _add(zf, "__main__.py", MAIN.encode())
        for arcname, path in _sources():
            _add(zf, arcname, path.read_bytes())
    return buf.getvalue()


def agent_sha256() -> str:
    return hashlib.sha256(build_agent()).hexdigest()


def remote_command(
    python: str, tmpdir: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The command line that makes the folder and starts the bootstrap there (POSIX ``sh``)."""
    assigns = dict(env or {})
    if tmpdir:
        assigns["TMPDIR"] = tmpdir
    for k in assigns:
        if not k.isidentifier():
            raise ValueError(f"bad environment variable name {k!r}")
    prefix = ["env", *(f"{k}={shlex.quote(str(v))}" for k, v in assigns.items())] if assigns else []
    return " ".join(
        [
            *prefix,
            "sh",
            "-c",
            shlex.quote(SHELL),
            "edgesplit-agent",
            shlex.quote(python),
            shlex.quote(BOOTSTRAP),
        ]
    )
