"""Profile one model on many remote devices at once: a fleet file and a bounded thread pool.

A fleet file (YAML) lists the hosts; ``defaults`` apply to each, and each host may override them::

    jobs: 4                          # at most this many hosts at a time
    defaults:
      identity: ~/.ssh/id_ed25519
      remote_python: python3
    hosts:
      - name: pi4                    # the profile goes to DIR/pi4.profile.json
        remote: pi@10.0.0.5
      - name: phone
        remote: u0_a123@192.168.1.20:8022
        remote_python: /data/data/com.termux/files/usr/bin/python
        device: snapdragon-8gen2     # a spec to profile with (default: host, detected there)

One host failing does not stop the others; each gets a :class:`HostResult`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesplit.device.spec import SpecSource
from edgesplit.errors import EdgesplitError, InputError, RemoteError
from edgesplit.profile.run import ProfileOptions
from edgesplit.profile.ssh import SshOptions, Target, parse_target

_OPTION_KEYS = {
    "identity": {"type": "string"},
    "known_hosts": {"type": "string"},
    "accept_new_host_key": {"type": "boolean"},
    "remote_python": {"type": "string"},
    "remote_tmpdir": {"type": "string"},
    "connect_timeout_s": {"type": "number", "exclusiveMinimum": 0},
    "step_timeout_s": {"type": "number", "exclusiveMinimum": 0},
    "device": {"type": "string"},
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["hosts"],
    "properties": {
        "jobs": {"type": "integer", "minimum": 1, "maximum": 256},
        "defaults": {"type": "object", "additionalProperties": False, "properties": _OPTION_KEYS},
        "hosts": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "remote"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
                    "remote": {"type": "string"},
                    **_OPTION_KEYS,
                },
            },
        },
    },
}

FleetEvent = Callable[[str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class FleetHost:
    """One host of a fleet file, its ``defaults`` and the command line's SSH options merged in.

    Attributes:
        name: The host's name; its profile is written to ``NAME.profile.json``.
        target: Where to connect (``USER@HOST[:PORT]`` parsed).
        opts: How to connect: key, known hosts, remote Python, timeouts.
        device: The spec to profile with (``host``: detected there).
    """

    name: str
    target: Target
    opts: SshOptions
    device: str = "host"


@dataclass(frozen=True)
class Fleet:
    """A fleet file as read by :func:`load_fleet`: its hosts, and how many are profiled at once.

    Attributes:
        path: The fleet file.
        hosts: Every host, in the file's order, with unique names.
        jobs: Hosts profiled at a time at most (the file's ``jobs``).
    """

    path: str
    hosts: tuple[FleetHost, ...]
    jobs: int = 4


@dataclass(frozen=True)
class HostResult:
    """How one host went.

    Attributes:
        name: The host's name in the fleet file.
        target: Where it was reached (``USER@HOST:PORT``).
        ok: Whether its profile was written.
        output: The profile written (empty on failure).
        error: Why it failed, one line (empty on success).
        exit_code: The CLI exit code of its failure (0 on success).
        elapsed_s: Wall time spent on it, failure included.
        entries: The profile's (processor, backend) entries.
        reused: Of those, how many were kept from an earlier run there (``resume``).
        energy: The profile's ``energy``: ``measured`` from power rails, else ``modelled``.
    """

    name: str
    target: str
    ok: bool
    output: str = ""
    error: str = ""
    exit_code: int = 0
    elapsed_s: float = 0.0
    entries: int = 0
    reused: int = 0
    energy: str = ""


def load_fleet(path: str | Path, base: SshOptions | None = None) -> Fleet:
    """Read and validate a fleet file; every problem is reported at once, naming file and key.

    ``base`` holds the options given on the command line; ``defaults`` and each host override them.
    """
    import jsonschema

    from edgesplit.device.schema import load_yaml
    from edgesplit.util import short

    p = Path(path)
    data = load_yaml(
        p, InputError, "fleet file"
    )  # no aliases: an alias bomb would expand in messages
    errors = sorted(
        jsonschema.Draft202012Validator(SCHEMA).iter_errors(data),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    if errors:
        msgs = [
            f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {short(e.message, 200)}"
            for e in errors[:5]
        ]
        raise InputError(
            f"{p}: " + "; ".join(msgs) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else "")
        )
    names = [h["name"] for h in data["hosts"]]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise InputError(
            f"{p}: hosts: duplicate names {', '.join(dups)} (each names an output file)"
        )
    base = base or SshOptions()
    defaults = data.get("defaults") or {}
    hosts = []
    problems = []
    for i, h in enumerate(data["hosts"]):
        merged = {**defaults, **h}
        try:
            target = parse_target(merged["remote"])
        except InputError as e:
            problems.append(f"hosts.{i}.remote: {e}")
            continue
        fields = {k: merged[k] for k in _OPTION_KEYS if k in merged and k != "device"}
        hosts.append(
            FleetHost(
                h["name"], target, dataclasses.replace(base, **fields), merged.get("device", "host")
            )
        )
    if problems:
        raise InputError(f"{p}: " + "; ".join(problems))
    return Fleet(str(p), tuple(hosts), int(data.get("jobs", 4)))


@dataclass(frozen=True)
class _Run:
    """What every host of one fleet run shares."""

    model: Path
    out: Path
    specs: Mapping[str, SpecSource]
    options: ProfileOptions | None
    input_shapes: Mapping[str, Sequence[int]] | None
    resume: bool
    cancel: threading.Event
    on_event: FleetEvent | None

    def tell(self, name: str, ev: Mapping[str, Any]) -> None:
        if self.cancel.is_set():
            raise RemoteError(f"{name}: cancelled")
        if self.on_event is not None:
            self.on_event(name, ev)


def _profile_host(run: _Run, h: FleetHost) -> HostResult:
    """One host; every failure becomes a failed :class:`HostResult`, never an exception."""
    from edgesplit.profile.remote import RemoteOptions, profile_remote

    started = time.perf_counter()
    run.tell(h.name, {"event": "start", "target": str(h.target)})
    reused: list[str] = []
    path = run.out / f"{h.name}.profile.json"

    def watch(ev: Mapping[str, Any]) -> None:
        if ev.get("event") == "plan":
            reused.extend(ev.get("reused", []))
        run.tell(h.name, ev)

    try:
        prof = profile_remote(
            run.model,
            h.target,
            RemoteOptions(h.opts, run.specs[h.device], run.resume),
            output=path,
            options=run.options,
            input_shapes=run.input_shapes,
            on_event=watch,
        )
        res = HostResult(
            h.name,
            str(h.target),
            True,
            str(path),
            elapsed_s=time.perf_counter() - started,
            entries=len(prof.entries),
            reused=len(reused),
            energy=prof.energy,
        )
    except EdgesplitError as e:
        res = HostResult(
            h.name,
            str(h.target),
            False,
            error=str(e),
            exit_code=e.exit_code,
            elapsed_s=time.perf_counter() - started,
        )
    except Exception as e:  # noqa: BLE001 - one host's bug must not take the others down
        res = HostResult(
            h.name,
            str(h.target),
            False,
            error=f"{type(e).__name__}: {e}",
            exit_code=1,
            elapsed_s=time.perf_counter() - started,
        )
    if run.on_event is not None:
        run.on_event(h.name, {"event": "done", "result": res})
    return res


def profile_fleet(
    model: str | Path,
    fleet: Fleet,
    out_dir: str | Path,
    *,
    options: ProfileOptions | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    jobs: int | None = None,
    resume: bool = False,
    on_event: FleetEvent | None = None,
) -> list[HostResult]:
    """Profile ``model`` on every host of ``fleet``, at most ``jobs`` at a time.

    Writes ``out_dir/NAME.profile.json`` per host. ``options`` (which pairs, how many runs) are the
    same for every host. ``on_event(name, event)`` sees each host's agent events plus
    ``{"event": "start"}`` and ``{"event": "done", "result": HostResult}``. Ctrl-C stops every host
    (each removes its remote folder) and is re-raised.
    """
    from edgesplit.profile.remote import remote_spec

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = {
        h.device: remote_spec(h.device) for h in fleet.hosts
    }  # bad specs fail before any connection
    run = _Run(Path(model), out, specs, options, input_shapes, resume, threading.Event(), on_event)
    workers = max(1, min(jobs or fleet.jobs, len(fleet.hosts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleet") as pool:
        futures = [pool.submit(_profile_host, run, h) for h in fleet.hosts]
        try:
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        except BaseException:
            # each running host stops at its next event, cleaning up its remote folder
            run.cancel.set()
            for f in futures:
                f.cancel()
            raise
    return [f.result() for f in futures]
