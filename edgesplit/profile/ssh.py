"""SSH connections for remote profiling: targets, host-key checking, key or agent auth, timeouts.

Host keys are checked against one known_hosts file (``~/.ssh/known_hosts`` unless told otherwise).
An unknown key is refused unless the caller opts in (``accept_new_host_key``), in which case it is
appended to that file; a key that differs from the one on file is always refused. Authentication
is by a key file or the SSH agent (and the default ``~/.ssh/id_*`` keys when no key file is
given); passwords are never accepted. Every failure becomes a one-line :class:`RemoteError` that
names the host: a :class:`RemoteHostError` (bad input, exit code 2) when the host cannot be
used at all.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edgesplit.errors import InputError, RemoteHostError
from edgesplit.util import atomic_write_text

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
PASSPHRASE_ENV = "EDGESPLIT_SSH_PASSPHRASE"
_TARGET = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^@\s:\[\]]+))"
    r"(?::(?P<port>\d{1,5}))?$"
)


@dataclass(frozen=True)
class Target:
    """Where to connect: ``user@host:port`` (IPv6 as ``user@[::1]:port``)."""

    user: str
    host: str
    port: int = 22

    @property
    def known_hosts_name(self) -> str:
        """The host's name in known_hosts (``[host]:port`` for ports other than 22)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}" + (f":{self.port}" if self.port != 22 else "")


def parse_target(text: str) -> Target:
    """Parse ``[user@]host[:port]``; the user defaults to the local user name.

    Raises:
        InputError: for anything else.
    """
    m = _TARGET.match(text.strip())
    port = int(m["port"]) if m and m["port"] else 22
    if m is None or not 0 < port < 65536:
        raise InputError(f"--remote '{text}': expected user@host[:port]")
    return Target(user=m["user"] or getpass.getuser(), host=m["v6"] or m["host"], port=port)


@dataclass(frozen=True)
class SshOptions:
    """How to reach a host and run the agent there.

    Attributes:
        identity: Private key file; when absent, the SSH agent and ``~/.ssh/id_*`` are tried.
        known_hosts: The known_hosts file checked (and, with ``accept_new_host_key``, extended).
        accept_new_host_key: Add an unknown host key instead of refusing it. A changed key is
            refused whatever this says.
        remote_python: The Python interpreter on the remote host.
        remote_tmpdir: Parent of the agent's private temporary folder (default ``$TMPDIR`` or
            ``/tmp`` there).
        connect_timeout_s: TCP connect, SSH banner, key exchange, auth and channel opening, each.
        step_timeout_s: The longest the agent may stay silent (it sends a heartbeat every few
            seconds while it works), and the longest an upload block may stall.
        remote_env: Extra environment variables for the agent (tests use them).
    """

    identity: str | None = None
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    accept_new_host_key: bool = False
    remote_python: str = "python3"
    remote_tmpdir: str | None = None
    connect_timeout_s: float = 15.0
    step_timeout_s: float = 120.0
    remote_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.known_hosts))


def fingerprint(key) -> str:
    """OpenSSH's SHA256 fingerprint of a paramiko key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _HostKeyRefused(Exception):
    def __init__(self, message: str):
        super().__init__(message)


def _policy(target: Target, opts: SshOptions):
    import paramiko

    class Policy(paramiko.MissingHostKeyPolicy):
        """Refuse unknown keys, or (opted in) record them in the known_hosts file."""

        def missing_host_key(self, client, hostname, key) -> None:
            path = opts.known_hosts_path
            if not opts.accept_new_host_key:
                raise _HostKeyRefused(
                    f"{target}: unknown host key ({key.get_name()} {fingerprint(key)}), not in "
                    f"{path}; "
                    "check it and rerun with --accept-new-host-key to trust it"
                )
            client.get_host_keys().add(hostname, key.get_name(), key)
            _append_known_host(path, hostname, key)

    return Policy()


def _append_known_host(path: Path, hostname: str, key) -> None:
    """Add one line to known_hosts, keeping everything already there (atomic rewrite)."""
    old = path.read_text() if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_text(path, f"{old}{hostname} {key.get_name()} {key.get_base64()}\n")


def _load_identity(path: str):
    import paramiko

    p = Path(os.path.expanduser(path))
    if not p.is_file():
        raise InputError(f"--identity {path}: no such key file")
    secret = os.environ.get(PASSPHRASE_ENV)
    try:
        return paramiko.PKey.from_path(p, secret.encode() if secret else None)
    except (paramiko.PasswordRequiredException, TypeError) as e:
        # cryptography raises TypeError("Key is password-protected, ...") for new-format keys
        if isinstance(e, TypeError) and "password-protected" not in str(e):
            raise InputError(f"--identity {path}: cannot read the key ({e})") from e
        raise InputError(
            f"--identity {path}: the key is encrypted; load it into ssh-agent (ssh-add) "
            f"or set {PASSPHRASE_ENV}"
        ) from None
    except (paramiko.SSHException, ValueError, OSError) as e:
        if secret:
            raise InputError(
                f"--identity {path}: cannot open the key with the passphrase in {PASSPHRASE_ENV} "
                "(wrong passphrase?)"
            ) from e
        raise InputError(f"--identity {path}: cannot read the key ({e})") from e


def connect(target: Target, opts: SshOptions):
    """An authenticated ``paramiko.SSHClient``, host key checked.

    Raises:
        RemoteHostError: unreachable, refused, unknown or changed host key, authentication failure,
            or a timeout; the message names the host.
        InputError: an unreadable key file.
    """
    import paramiko

    pkey = _load_identity(opts.identity) if opts.identity else None  # InputError before any network
    client = paramiko.SSHClient()
    path = opts.known_hosts_path
    if path.is_file():
        try:
            client.load_host_keys(str(path))
        except (OSError, paramiko.SSHException) as e:
            raise InputError(f"{path}: cannot read known_hosts ({e})") from e
    client.set_missing_host_key_policy(_policy(target, opts))
    t = opts.connect_timeout_s
    try:
        client.connect(
            target.host,
            port=target.port,
            username=target.user,
            pkey=pkey,
            allow_agent=pkey is None,
            look_for_keys=pkey is None,
            timeout=t,
            banner_timeout=t,
            auth_timeout=t,
            channel_timeout=t,
        )
    except Exception as e:
        client.close()
        raise _connect_error(target, opts, e) from e
    except BaseException:
        client.close()
        raise
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(max(1, int(min(15.0, opts.step_timeout_s / 4))))
    return client


def _connect_error(target: Target, opts: SshOptions, e: Exception) -> RemoteHostError:
    import paramiko

    if isinstance(e, _HostKeyRefused):
        return RemoteHostError(str(e))
    if isinstance(e, paramiko.BadHostKeyException):
        return RemoteHostError(
            f"{target}: the host key has CHANGED (server sent {e.key.get_name()} "
            f"{fingerprint(e.key)}, "
            f"{opts.known_hosts_path} has {fingerprint(e.expected_key)}); refusing to connect. If "
            "the "
            f"change is expected, remove the old key: ssh-keygen -R '{target.known_hosts_name}' "
            f"-f {opts.known_hosts_path}"
        )
    if isinstance(e, paramiko.AuthenticationException):
        how = f"key {opts.identity}" if opts.identity else "the SSH agent and ~/.ssh/id_* keys"
        return RemoteHostError(f"{target}: authentication failed with {how} ({e})")
    if isinstance(e, paramiko.SSHException) and "No authentication methods available" in str(e):
        return RemoteHostError(
            f"{target}: authentication failed: no key to offer (the SSH agent has none and there "
            "is "
            "no ~/.ssh/id_*); pass --identity KEY or load a key with ssh-add"
        )
    if isinstance(e, socket.gaierror):
        return RemoteHostError(f"{target}: cannot resolve host '{target.host}' ({e.strerror})")
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        return RemoteHostError(f"{target}: connection refused on port {target.port}")
    if isinstance(e, TimeoutError | socket.timeout):
        return RemoteHostError(
            f"{target}: timed out after {opts.connect_timeout_s:g} s while connecting"
        )
    if isinstance(e, paramiko.SSHException):
        msg = str(e) or type(e).__name__
        if "timeout" in msg.lower() or "banner" in msg.lower():
            msg += f" (timeout {opts.connect_timeout_s:g} s)"
        return RemoteHostError(f"{target}: SSH failed: {msg}")
    if isinstance(e, OSError):
        return RemoteHostError(f"{target}: cannot connect ({e.strerror or e})")
    return RemoteHostError(f"{target}: cannot connect ({type(e).__name__}: {e})")


class PortForward:
    """``ssh -L``: a port on 127.0.0.1 here whose connections are carried over an SSH connection to
    ``host:port`` as the remote end sees it, one ``direct-tcpip`` channel each.

    Nothing else listens: the port is bound to the loopback address and lives as long as the
    object (``close()``, or use it as a context manager). ``connections`` counts the connections
    carried; ``errors`` keeps why a channel could not be opened (the remote refused, say).
    """

    def __init__(self, transport, host: str, port: int, timeout_s: float = 15.0):
        import threading

        self.transport, self.host, self.remote_port, self.timeout_s = (
            transport,
            host,
            port,
            timeout_s,
        )
        self.connections = 0
        self.errors: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._open: set = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"forward-{self.port}", daemon=True).start()

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        import threading

        while not self._closed.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed
            try:
                chan = self.transport.open_channel(
                    "direct-tcpip", (self.host, self.remote_port), peer, timeout=self.timeout_s
                )
            except Exception as e:  # noqa: BLE001 - paramiko's ChannelException, EOFError, timeouts
                self.errors.append(f"cannot open a tunnel to {self.host}:{self.remote_port} ({e})")
                conn.close()
                continue
            with self._lock:
                self.connections += 1
                self._open.update((conn, chan))
            threading.Thread(target=self._pump, args=(conn, chan), daemon=True).start()

    def _pump(self, conn: socket.socket, chan) -> None:
        import select

        try:
            while not self._closed.is_set():
                ready, _, _ = select.select([conn, chan], [], [], 0.5)
                for src, dst in ((conn, chan), (chan, conn)):
                    if src in ready:
                        data = src.recv(65536)
                        if not data:
                            return
                        dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.difference_update((conn, chan))
            chan.close()
            conn.close()

    def close(self) -> None:
        """Stop listening and close every tunnelled connection."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            for end in list(self._open):
                end.close()
            self._open.clear()
