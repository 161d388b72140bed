"""TVM's RPC server on a board, started by the edgesplit agent and reached through SSH, for tuning.

MetaSchedule measures candidates on a board through TVM's RPC protocol: it uploads each compiled
candidate to an RPC server there, which loads and times it. :class:`RemoteRpcServer` opens one
agent session (:class:`~edgesplit.profile.remote.AgentSession`: host-key checks, a private
temporary folder, cleanup on every way out), asks the agent to start ``python -m
tvm.exec.rpc_server`` bound to the board's loopback address, and forwards a local port to it over
the same SSH connection (:class:`~edgesplit.profile.ssh.PortForward`). Nothing listens on the
board's network; on exit the tunnel closes, the agent stops the server (its whole process group)
and removes the folder, where the server kept its temporary files.

The agent side (:func:`agent_request`, :func:`stop_server`) uses the standard library only, as the
rest of the agent does.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from edgesplit.util import Closing

LOG = "rpc_server.log"
START_TIMEOUT_S = 120.0  # importing TVM on a small board is slow
_BOUND = re.compile(r"bind to 127\.0\.0\.1:(\d+)")


# -- on the board, inside the agent --------------------------------------------------------------


def agent_request(agent, op: str, msg: dict[str, Any], server: subprocess.Popen | None):
    """Serve ``rpc_start`` or ``rpc_stats``; returns the server process (None when there is
    none)."""
    if op == "rpc_start" and server is None:
        server = _start(agent.workdir, msg)
        if server is None:
            agent.send(
                "error",
                exit_code=2,
                type="MissingModules",
                missing=["apache-tvm"],
                message="the remote Python lacks tvm (its RPC server measures the candidates)",
            )
            return None
    if server is None:
        agent.send("error", exit_code=1, message="agent: no RPC server is running")
        return None
    log = _read_log(agent.workdir)
    if op == "rpc_start":
        try:
            port = _wait_bound(agent.workdir, server)
        except BaseException:
            stop_server(server)
            raise
        agent.send("rpc_ready", port=port, pid=server.pid)
    else:
        agent.send(
            "rpc_stats",
            pid=server.pid,
            running=server.poll() is None,
            sessions=log.count("connected from"),
            modules_loaded=log.count("load_module"),
        )
    return server


def _start(workdir: str, msg: dict[str, Any]) -> subprocess.Popen | None:
    import ctypes
    import importlib.util

    if importlib.util.find_spec("tvm") is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: the child only calls it
    except OSError:
        libc = None
    env = dict(os.environ)
    if msg.get("threads"):
        env["TVM_NUM_THREADS"] = str(int(msg["threads"]))
    cores = {int(c) for c in msg.get("cores") or ()}
    port = int(msg.get("port", 9090))
    with open(os.path.join(workdir, LOG), "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1"]
            + ["--port", str(port), "--port-end", str(port + 200)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,  # one process group: stop_server ends the server's workers too
            preexec_fn=lambda: _child_setup(libc, cores),
        )


def _child_setup(libc, cores: set[int]) -> None:
    """In the server process: die with the agent, and run on the processor's cores."""
    if libc is not None:
        with contextlib.suppress(Exception):
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def _read_log(workdir: str) -> str:
    try:
        with open(os.path.join(workdir, LOG), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _wait_bound(workdir: str, server: subprocess.Popen) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        m = _BOUND.search(_read_log(workdir))
        if m:
            return int(m.group(1))
        if server.poll() is not None:
            tail = _read_log(workdir).strip().splitlines()[-1:] or [""]
            raise RuntimeError(
                f"TVM's RPC server ended (exit {server.returncode}): {tail[0][:300]}"
            )
        time.sleep(0.1)
    raise RuntimeError(f"TVM's RPC server did not start within {START_TIMEOUT_S:g} s")


def stop_server(server: subprocess.Popen) -> None:
    """End the server's process group: SIGTERM, then SIGKILL after 5 s."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=wait_s)
            return


# -- here ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RpcStats:
    """What the board's RPC server has done: sessions served (one per measured candidate) and
    modules it loaded, counted from its own log, and its process id there."""

    pid: int
    running: bool
    sessions: int
    modules_loaded: int


class RemoteRpcServer(Closing):
    """TVM's RPC server on ``target``, reachable here at ``("127.0.0.1", self.port)``.

    Args:
        threads: ``TVM_NUM_THREADS`` for the server (the processor's thread count).
        cores: Cores to pin the server to on the board (the processor's).

    Raises:
        RemoteError: as for remote profiling (unreachable, host key refused, no tvm there...).
    """

    def __init__(self, target, opts=None, *, threads: int | None = None, cores=None, on_event=None):
        from edgesplit.profile.ssh import SshOptions, parse_target

        self.target = parse_target(target) if isinstance(target, str) else target
        self.opts = opts or SshOptions()
        self.threads, self.cores, self.on_event = threads, list(cores or ()), on_event
        self.session = None
        self.forward = None
        self.remote_port = 0
        self.pid = 0

    @property
    def port(self) -> int:
        return self.forward.port

    def open(self) -> None:
        from edgesplit.profile.remote import AgentSession
        from edgesplit.profile.ssh import PortForward

        self.session = AgentSession(self.target, self.opts, self.on_event).__enter__()
        self.session.stage = "starting TVM's RPC server"
        self.session.send("rpc_start", threads=self.threads, cores=self.cores)
        ready = self.session.expect("rpc_ready")
        self.remote_port, self.pid = int(ready["port"]), int(ready["pid"])
        self.forward = PortForward(
            self.session.client.get_transport(),
            "127.0.0.1",
            self.remote_port,
            self.opts.connect_timeout_s,
        )
        self.session.stage = "tuning (measuring candidates over RPC)"

    def stats(self) -> RpcStats:
        self.session.send("rpc_stats")
        ev = self.session.expect("rpc_stats")
        return RpcStats(
            int(ev["pid"]), bool(ev["running"]), int(ev["sessions"]), int(ev["modules_loaded"])
        )

    def close(self) -> None:
        """Close the tunnel; the agent stops the server and removes its folder as it ends."""
        if self.forward is not None:
            self.forward.close()
            self.forward = None
        if self.session is not None:
            self.session.close()
            self.session = None
