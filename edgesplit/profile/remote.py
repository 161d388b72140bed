"""Profile a model on a remote host over SSH, with the same profiler and format as locally.

One session is one SSH connection and one ``exec_command``: the remote command makes a private
folder (``mktemp -d``), receives the agent zipapp and starts it (:mod:`agentzip`); the model goes
up through the agent's stdin, progress and checkpoints come back as JSON lines
(:mod:`edgesplit.profile.agent`). Each finished processor/backend pair is saved locally in a
partial profile (``OUT.partial``), so a rerun with ``resume=True`` measures only what is missing.
The remote folder is removed on every way out: by the client (closing the agent's input, then
``rm -rf`` if the agent did not confirm), by the agent on end of input or a signal, and by a shell
trap when the agent dies.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesplit.device.spec import SpecSource
from edgesplit.errors import EdgesplitError, RemoteError, RemoteHostError
from edgesplit.profile.agentzip import (
    EXIT_MKTEMP,
    EXIT_NO_PYTHON,
    HELLO,
    build_agent,
    remote_command,
)
from edgesplit.profile.run import ProfileOptions
from edgesplit.profile.ssh import SshOptions, Target, connect, parse_target
from edgesplit.profile.steps import load_partial, partial_path, save_partial
from edgesplit.profile.store import ProcessorProfile, Profile
from edgesplit.util import Closing, Progress, sha256_file

EventHook = Callable[[dict[str, Any]], None]
_CHUNK = 256 * 1024
MAX_LINE_NBYTES = 64 << 20
"""Longest event line read from an agent (a checkpoint of a large model is a few MB)."""


def pip_hint(python: str, missing: Sequence[str], machine: str = "", android: bool = False) -> str:
    """What to run on the remote to get ``missing`` modules, pinned to the versions used here."""
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for m in missing:
        try:
            pins.append(f"{m}=={version(m)}")
        except PackageNotFoundError:
            pins.append(m)
    hint = f"{python} -m pip install {' '.join(pins)}"
    if "onnxruntime" in missing and (android or machine.startswith(("armv7", "armv6", "armhf"))):
        hint += (
            " (PyPI has no onnxruntime wheel for Termux/Android or 32-bit ARM: build it from "
            "source, "
            "or run a glibc aarch64 userland such as proot-distro's Debian, where the pip wheel "
            "works)"
        )
    return hint


class AgentSession(Closing):
    """A running agent on ``target``: send requests, read events, always clean up.

    Use as a context manager. Events other than ``alive`` are passed to ``on_event`` too.
    """

    def __init__(self, target: Target, opts: SshOptions, on_event: EventHook | None = None):
        self.target, self.opts, self.on_event = target, opts, on_event
        self.client = None
        self.chan = None
        self.ready: dict[str, Any] = {}
        self._buf = bytearray()
        self._scanned = 0  # how much of _buf is known to hold no newline
        self._stderr = b""
        self._bye = False
        self._shell: tuple[str, str] | None = None  # (pid, folder) of the remote shell
        self.stage = "connecting"

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        self.client = connect(self.target, self.opts)
        self.stage = "starting the agent"
        self.chan = self.client.get_transport().open_session(timeout=self.opts.connect_timeout_s)
        self.chan.settimeout(self.opts.step_timeout_s)
        self.chan.exec_command(
            remote_command(self.opts.remote_python, self.opts.remote_tmpdir, self.opts.remote_env)
        )
        agent = build_agent()
        self._send(f"{len(agent)}\n".encode() + agent)
        self.ready = self.expect("ready")
        self.stage = "working"

    def close(self) -> None:
        """End the agent (it removes its folder); make sure the folder is gone; disconnect."""
        try:
            if self.chan is not None and self._alive():
                try:
                    self.chan.shutdown_write()  # end of input: the agent cleans up and says bye
                    deadline = time.monotonic() + min(10.0, self.opts.step_timeout_s)
                    while not self._bye and time.monotonic() < deadline:
                        ev = self._next_event(deadline, quiet=True)
                        if ev is None:
                            break
                except (OSError, EdgesplitError, EOFError):
                    pass
                if self._shell and not self._bye and self._alive():
                    self._kill_and_rm(*self._shell)
        finally:
            if self.client is not None:
                self.client.close()
            self.client = self.chan = None

    def _alive(self) -> bool:
        t = self.client.get_transport() if self.client is not None else None
        return bool(t and t.is_active())

    def _kill_and_rm(self, pid: str, workdir: str) -> None:
        """The agent did not confirm its cleanup (it hangs, or never started): do it from here."""
        try:
            cmd = f"rm -rf -- {shlex.quote(workdir)}; pkill -TERM -P {int(pid)} 2>/dev/null; true"
            _, out, _ = self.client.exec_command(cmd, timeout=self.opts.connect_timeout_s)
            out.channel.recv_exit_status()
        except Exception:  # noqa: BLE001 - best effort; the agent and the trap clean up too
            pass

    # -- bytes ------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except TimeoutError as e:
            raise RemoteError(
                f"{self.target}: the agent took no input for {self.opts.step_timeout_s:g} s "
                f"while {self.stage} (step timeout)"
            ) from e
        except Exception as e:  # noqa: BLE001 - EOFError, OSError, paramiko's SSHException
            raise self._broken() from e

    def send(self, op: str, **fields: Any) -> None:
        self._send(json.dumps({"op": op, **fields}).encode() + b"\n")

    def upload(self, path: Path, name: str, progress: Progress | None = None) -> dict[str, Any]:
        """Send a file into the agent's folder; checks its sha256 there."""
        size = path.stat().st_size
        self.send("put", name=name, nbytes=size)
        label = "upload"
        with open(path, "rb") as f:
            sent = 0
            while chunk := f.read(_CHUNK):
                self._send(chunk)
                sent += len(chunk)
                if progress is not None:
                    progress(label, sent // 1024, max(1, size // 1024))
        stored = self.expect("stored")
        if stored["sha256"] != sha256_file(path):
            raise RemoteError(f"{self.target}: {path.name} arrived corrupted (sha256 differs)")
        return stored

    # -- events -----------------------------------------------------------------------------
    def _error(self, message: str) -> RemoteError:
        """A host that breaks the protocol before the agent is up cannot be used (exit 2); one that
        breaks off later failed while working (exit 1, and a resumable profile stays)."""
        before = self.stage in ("connecting", "starting the agent")  # later stages: rpc.py's too
        return RemoteHostError(message) if before else RemoteError(message)

    def _broken(self) -> RemoteError:
        chan = self.chan
        deadline = time.monotonic() + 2.0  # an exit status follows the end of output closely
        while (
            chan is not None
            and self._alive()
            and not chan.exit_status_ready()
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        if chan is None or not self._alive() or not chan.exit_status_ready():
            return self._error(f"{self.target}: connection dropped while {self.stage}")
        code = chan.recv_exit_status()
        tail = self._stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if code == EXIT_NO_PYTHON:
            return RemoteHostError(
                f"{self.target}: remote Python '{self.opts.remote_python}' not found "
                f"(pass --remote-python PATH)"
            )
        if code == EXIT_MKTEMP:
            return RemoteError(
                f"{self.target}: cannot make a temporary folder with mktemp -d ({tail[0]})"
            )
        return self._error(
            f"{self.target}: the agent ended (exit {code}) while {self.stage}: {tail[0][:300]}"
        )

    def _pump(self, timeout: float) -> bool:
        """Read what is there within ``timeout``; False at end of output."""
        chan = self.chan
        got = False
        if chan.recv_stderr_ready():
            self._stderr = (self._stderr + chan.recv_stderr(65536))[-8192:]
            got = True
        if chan.recv_ready():
            data = chan.recv(65536)
            if not data:
                return False
            self._buf += data
            return True
        if got:
            return True
        if chan.eof_received or chan.closed:
            while chan.recv_stderr_ready():
                self._stderr = (self._stderr + chan.recv_stderr(65536))[-8192:]
            return chan.recv_ready()
        select.select([chan], [], [], timeout)
        return True

    def _next_event(self, deadline: float, quiet: bool = False) -> dict[str, Any] | None:
        while True:
            nl = self._buf.find(b"\n", self._scanned)
            if nl < 0:
                self._scanned = len(self._buf)
                if self._scanned > MAX_LINE_NBYTES:
                    raise self._error(
                        f"{self.target}: the agent sent a line longer than {MAX_LINE_NBYTES:,} "
                        "bytes "
                        f"while {self.stage}"
                    )
            else:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                self._scanned = 0
                if line.startswith(HELLO) and self._shell is None:
                    pid, _, folder = line[len(HELLO) :].decode(errors="replace").partition(" ")
                    self._shell = (pid, folder)
                    continue
                try:
                    ev = json.loads(line)
                except (ValueError, RecursionError):
                    continue  # not ours (cannot happen: stray output goes to stderr)
                if not isinstance(ev, dict):
                    continue
                if ev.get("event") == "bye":
                    self._bye = bool(ev.get("removed"))
                return ev
            now = time.monotonic()
            if now >= deadline:
                if quiet:
                    return None
                raise RemoteError(
                    f"{self.target}: no word from the agent for {self.opts.step_timeout_s:g} s "
                    f"while {self.stage} (step timeout)"
                )
            if not self._pump(min(0.5, deadline - now)):
                if quiet:
                    return None
                raise self._broken()

    def events(self):
        """Events as they come; a silence longer than the step timeout is an error."""
        while True:
            ev = self._next_event(time.monotonic() + self.opts.step_timeout_s)
            if ev.get("event") == "alive":
                continue
            if self.on_event is not None:
                self.on_event(ev)
            if ev.get("event") == "error":
                raise self._agent_error(ev)
            yield ev

    def expect(self, event: str) -> dict[str, Any]:
        for ev in self.events():
            if ev.get("event") == event:
                return ev
        raise AssertionError("unreachable")

    def _agent_error(self, ev: dict[str, Any]) -> EdgesplitError:
        if ev.get("type") == "MissingModules":
            hint = pip_hint(
                self.opts.remote_python,
                ev.get("missing", []),
                self.ready.get("machine", ""),
                "com.termux" in self.ready.get("python", ""),
            )
            return RemoteHostError(
                f"{self.target}: the remote Python lacks {', '.join(ev['missing'])}; "
                f"install them there: {hint}"
            )
        err = RemoteError(f"{self.target}: {ev.get('message', 'the agent failed')}")
        err.exit_code = int(ev.get("exit_code", 1))
        return err


@dataclass(frozen=True)
class RemoteOptions:
    """How to profile on a remote host.

    Attributes:
        ssh: How to reach it and run the agent there.
        device: The spec to profile it with (read and validated here, detected there); default
            ``host``, i.e. the remote host as detected there.
        resume: Reuse the pairs already saved in ``OUTPUT.partial`` by an earlier, broken run.
    """

    ssh: SshOptions = field(default_factory=SshOptions)
    device: SpecSource | None = None
    resume: bool = False


@dataclass
class _Job:
    """One remote profile in progress: what goes up, and the entries that came back so far."""

    model: Path
    sha256: str
    spec: SpecSource
    partial: Path
    options: ProfileOptions
    input_shapes: Mapping[str, Sequence[int]]
    done: list[ProcessorProfile]
    entries: dict[str, ProcessorProfile] = field(default_factory=dict)

    def checkpoint(self, host: str) -> None:
        save_partial(
            self.partial,
            self.sha256,
            _model_name(self.model),
            self.spec.name,
            self.input_shapes,
            self.entries.values(),
            host,
        )


def profile_remote(
    model: str | os.PathLike,
    target: str | Target,
    remote: RemoteOptions | None = None,
    *,
    output: str | os.PathLike,
    options: ProfileOptions | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    progress: Progress | None = None,
    on_event: EventHook | None = None,
) -> Profile:
    """Profile ``model`` on ``target`` and write the profile to ``output`` (atomically).

    Args:
        remote: SSH options, the device spec and whether to resume (:class:`RemoteOptions`).
        options: Which pairs and how many runs, as locally (:class:`ProfileOptions`).
        on_event: Sees every agent event (tests use it to break the connection mid-run).

    Raises:
        RemoteError: the host cannot be reached, refuses us, drops the connection, lacks modules,
            or the agent fails; the message names the host.
        DeviceSpecError: the spec is not a device spec.
    """
    tgt = parse_target(target) if isinstance(target, str) else target
    remote = remote or RemoteOptions()
    spec = remote_spec(remote.device)
    out = Path(output)
    job = _Job(
        model=Path(model),
        sha256=sha256_file(model),
        spec=spec,
        partial=partial_path(out),
        options=options or ProfileOptions(),
        input_shapes=dict(input_shapes or {}),
        done=[],
    )
    if remote.resume:
        job.done = load_partial(job.partial, job.sha256, spec.name)
    job.entries = {e.key: e for e in job.done}
    try:
        with AgentSession(tgt, remote.ssh, on_event) as s:
            prof = _run_profile(s, job, progress)
    except RemoteError as e:
        if job.entries:
            one = len(job.entries) == 1
            raise RemoteError(
                f"{e}; {', '.join(job.entries)} {'is' if one else 'are'} saved in {job.partial}: "
                f"rerun with --resume to keep {'it' if one else 'them'}"
            ) from e
        raise
    if prof.model_sha256 != job.sha256:
        raise RemoteError(
            f"{tgt}: the profile is of another model (sha256 {prof.model_sha256[:12]})"
        )
    prof.save(out)
    job.partial.unlink(missing_ok=True)
    return prof


def _run_profile(s: AgentSession, job: _Job, progress: Progress | None) -> Profile:
    s.stage = f"uploading {job.model.name}"
    s.upload(job.model, "model.onnx", progress)
    s.stage = "profiling"
    s.send(
        "profile",
        model="model.onnx",
        display=str(job.model),
        model_name=_model_name(job.model),
        input_shapes={k: list(v) for k, v in job.input_shapes.items()},
        device=dict(job.spec.data),
        options=job.options.to_json(),
        done=[e.to_json() for e in job.done],
    )
    for ev in s.events():
        kind = ev.get("event")
        if kind == "progress" and progress is not None:
            progress(ev["label"], ev["done"], ev["total"])
        elif kind == "plan":
            s.stage = f"profiling ({', '.join(ev['pairs'])})"
        elif kind == "entry":
            e = ProcessorProfile.from_json(ev["entry"])
            job.entries[e.key] = e
            s.stage = f"profiling (after {e.key})"
            job.checkpoint(str(s.target))
        elif kind == "result":
            return Profile.from_json(ev["profile"], str(s.target))
    raise AssertionError("unreachable: events() ends only by raising")


def _model_name(path: Path) -> str:
    return path.name[:-5] if path.name.endswith(".onnx") else path.stem


def remote_spec(device: SpecSource | str | os.PathLike | None = None) -> SpecSource:
    """The spec a remote host is profiled with, read and validated here: ``host`` by default.

    Raises:
        DeviceSpecError: for a spec that cannot be read, or is not a device spec.
    """
    from edgesplit.device.spec import read_spec
    from edgesplit.errors import DeviceSpecError

    spec = device if isinstance(device, SpecSource) else read_spec(device or "host")
    if spec.kind != "device":
        raise DeviceSpecError(
            f"{spec.path}: kind: a remote profile needs a device spec, not '{spec.kind}'"
        )
    return spec


def detect_remote(target: str | Target, opts: SshOptions | None = None) -> dict[str, Any]:
    """The remote host's facts (:func:`edgesplit.device.detect.probe`, run there)."""
    tgt = parse_target(target) if isinstance(target, str) else target
    with AgentSession(tgt, opts or SshOptions()) as s:
        s.stage = "probing the device"
        s.send("detect")
        facts = s.expect("detected")["facts"]
    facts.setdefault("ssh_target", str(tgt))
    return facts
