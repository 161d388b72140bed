"""The profiling agent that runs on the remote host, inside its private temporary folder.

It is shipped as a zipapp (:mod:`edgesplit.profile.agentzip`) and started once per session. It
speaks JSON lines: requests on stdin, events on stdout (its real stdout; anything else that
prints goes to stderr, so a chatty library cannot break the protocol).

Requests (one JSON object per line)::

    {"op": "put", "name": "model.onnx", "nbytes": N}    followed by exactly N raw bytes
    {"op": "profile", "model": "model.onnx", "input_shapes": {...}, "device": {spec},
     "options": {ProfileOptions}, "done": [entries]}
    {"op": "detect"}
    {"op": "rpc_start", "threads": N, "cores": [...]}   TVM's RPC server in the folder (for tuning)
    {"op": "rpc_stats"}                                   sessions served and modules loaded so far
    {"op": "exit"}                                       (end of input means the same)

Events: ``ready`` (versions, missing modules), ``stored``, ``plan``, ``progress``, ``entry`` (a
finished processor/backend pair: the client's checkpoint), ``result``, ``detected``, ``error``,
``alive`` (a heartbeat every few seconds, so the client can time out on silence), ``rpc_ready``,
``rpc_stats`` and ``bye``.

The agent removes its folder when its input ends, on ``exit``, on SIGHUP/SIGTERM/SIGINT and at
interpreter exit: a dropped connection leaves nothing behind. An RPC server it started (its own
process group, its temporary files in the folder) is stopped first, and dies with the agent even
when the agent is killed (parent-death signal). This module imports only the
standard library at load time; the profiler is imported when a profile is asked for.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import platform
import queue
import re
import shutil
import signal
import sys
import threading
import time
import traceback
from typing import Any, BinaryIO

from edgesplit.device.detect import PROFILE_MODULES, module_versions

HEARTBEAT_S = 5.0
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")


class Agent:
    """One agent process: a reader thread for stdin, a heartbeat thread, requests on the main
    thread."""

    def __init__(self, workdir: str, out: BinaryIO, inp: BinaryIO):
        self.workdir = os.path.realpath(workdir)
        self.out = out
        self.inp = inp
        self.requests: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._removed = False
        self._rpc = None  # TVM's RPC server, when started

    # -- output -----------------------------------------------------------------------------
    def send(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields}, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            try:
                self.out.write(line)
                self.out.flush()
            except (OSError, ValueError):
                pass  # the client is gone; the reader thread sees end of input and cleans up

    # -- the folder -------------------------------------------------------------------------
    def cleanup(self) -> bool:
        """Stop the RPC server and remove the work folder (idempotent); True when it is gone."""
        if self._rpc is not None:
            from edgesplit.backends.tvm.rpc import stop_server

            stop_server(self._rpc)
            self._rpc = None
        if not self._removed:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._removed = not os.path.exists(self.workdir)
        return self._removed

    def finish(self, code: int = 0) -> None:
        """Clean up, say goodbye (if anyone listens) and leave at once, whatever else runs."""
        removed = self.cleanup()
        self.send("bye", removed=removed, workdir=self.workdir)
        os._exit(code)

    # -- threads ----------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                line = self.inp.readline()
            except (OSError, ValueError):
                line = b""
            if not line:
                self.finish(0)
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                self.send("error", exit_code=1, message=f"agent: bad request line ({e})")
                continue
            if msg.get("op") == "exit":
                self.finish(0)
            elif msg.get("op") == "put":
                self._put(msg)
            else:
                self.requests.put(msg)

    def _put(self, msg: dict[str, Any]) -> None:
        name, left = str(msg.get("name", "")), int(msg.get("nbytes", -1))
        if not _SAFE_NAME.match(name) or left < 0:
            self.send("error", exit_code=1, message=f"agent: refusing upload name {name!r}")
            self.finish(1)  # the raw bytes that follow cannot be skipped safely
        h = hashlib.sha256()
        with open(os.path.join(self.workdir, name), "wb") as f:
            while left > 0:
                chunk = self.inp.read(min(left, 1 << 20))
                if not chunk:
                    self.finish(0)
                f.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        self.send("stored", name=name, nbytes=int(msg["nbytes"]), sha256=h.hexdigest())

    def _heartbeat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            self.send("alive")

    # -- requests ---------------------------------------------------------------------------
    def serve(self) -> None:
        threading.Thread(target=self._read, name="agent-reader", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="agent-heartbeat", daemon=True).start()
        self.send(
            "ready",
            pid=os.getpid(),
            workdir=self.workdir,
            python=sys.executable,
            python_version=platform.python_version(),
            machine=platform.machine(),
            hostname=platform.node(),
            modules=module_versions(),
        )
        while True:
            msg = self.requests.get()
            op = msg.get("op")
            try:
                if op == "profile":
                    self.profile(msg)
                elif op == "detect":
                    self.detect(msg)
                elif op in ("rpc_start", "rpc_stats"):
                    from edgesplit.backends.tvm.rpc import agent_request

                    self._rpc = agent_request(self, op, msg, self._rpc)
                else:
                    self.send("error", exit_code=1, message=f"agent: unknown op {op!r}")
            except Exception as e:  # noqa: BLE001 - reported to the client, which decides
                self._report(e, msg)

    def _report(self, e: Exception, msg: dict[str, Any]) -> None:
        code = getattr(e, "exit_code", 1)
        text = str(e).replace(
            self.workdir + os.sep + str(msg.get("model", "")), str(msg.get("display", "model"))
        )
        if getattr(e, "exit_code", None) is None:
            traceback.print_exc(file=sys.stderr)
            text = f"{type(e).__name__}: {text}"
        self.send("error", exit_code=code, type=type(e).__name__, message=text.replace("\n", " "))

    def profile(self, msg: dict[str, Any]) -> None:
        missing = [m for m, v in module_versions(PROFILE_MODULES).items() if v is None]
        if missing:
            self.send(
                "error",
                exit_code=2,
                type="MissingModules",
                missing=missing,
                message=f"the remote Python lacks {', '.join(missing)}",
            )
            return
        from edgesplit.device.spec import device_from_mapping
        from edgesplit.model.load import load_model
        from edgesplit.profile.power import find_rails
        from edgesplit.profile.run import ProfileOptions
        from edgesplit.profile.steps import pairs, profile_steps
        from edgesplit.profile.store import ProcessorProfile

        name = str(msg["model"])
        if not _SAFE_NAME.match(name):
            raise ValueError(f"bad model name {name!r}")
        graph = load_model(os.path.join(self.workdir, name), msg.get("input_shapes") or {})
        spec = msg["device"]
        where = f"{spec.get('name')} (on {platform.node()})"
        device = device_from_mapping(
            spec, where, local=True, validated=True
        )  # the client checked it
        options = ProfileOptions.from_json(msg.get("options") or {})
        rails = find_rails(os.environ.get("EDGESPLIT_SYSFS_ROOT", "/"))
        done = [ProcessorProfile.from_json(e) for e in msg.get("done", [])]
        self.send(
            "plan",
            pairs=pairs(device, options),
            reused=[e.key for e in done],
            power=rails.source,
            power_rails=[r.name for r in rails.rails],
            skipped=list(rails.skipped),
        )
        last: dict[str, float] = {}

        def progress(label: str, n: int, total: int) -> None:
            now = time.monotonic()
            if n in (1, total) or now - last.get(label, 0.0) >= 0.1:
                last[label] = now
                self.send("progress", label=label, done=n, total=total)

        prof = profile_steps(
            graph,
            device,
            options,
            progress=progress,
            done=done,
            rails=rails,
            on_entry=lambda e: self.send("entry", entry=e.to_json()),
        )
        if msg.get("model_name"):
            import dataclasses

            prof = dataclasses.replace(prof, model_name=str(msg["model_name"]))
        self.send("result", profile=prof.to_json())

    def detect(self, msg: dict[str, Any]) -> None:
        from edgesplit.device.detect import probe

        self.send("detected", facts=probe(os.environ.get("EDGESPLIT_SYSFS_ROOT", "/")))


def main(workdir: str) -> int:
    """Run the agent in ``workdir`` (its own folder, removed when it ends)."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints (TVM, onnxslim) go to stderr, not into the protocol
    sys.stdout = sys.stderr
    agent = Agent(workdir, out, sys.stdin.buffer)
    atexit.register(agent.cleanup)
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: agent.finish(128 + signum))
    agent.serve()
    return 0
