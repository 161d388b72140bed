"""A small, strict Open Inference Protocol v2 client: keep-alive, binary tensors, deadlines,
retries.

Each thread keeps one persistent HTTP/1.1 connection per client (``http.client``; TCP_NODELAY so
the JSON header and the tensor bytes are not held back by Nagle). Every call has one deadline
that bounds the connect, the send, the wait and the read together, so a call never hangs: it
returns or raises :class:`~edgesplit.errors.RemoteError` within ``timeout_s``. Transport failures
(refused, reset, timed out, 502/503/504) are retried with exponential backoff (or the server's
``Retry-After``) while the deadline allows; a stale keep-alive connection is replaced at once.
Answers the server gives on purpose (4xx, 500) are not retried; their error message is kept.

The server's framing is not trusted (offload runs over Wi-Fi, where anyone on the path can answer):
every read from the socket, in the status line, the headers, a chunk-size line or the body, waits
at most until the call's deadline, so a server that trickles bytes cannot stretch it; a body over
``max_response_nbytes`` (declared or chunked) is refused before it is buffered; the error text a
server sends is shortened and stripped of control characters before it reaches a message.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from edgesplit.errors import RemoteError, RemoteHostError
from edgesplit.runtime import oip, wire

RETRY_STATUS = frozenset({502, 503, 504})
MB = 1 << 20


@dataclass(frozen=True)
class Exchange:
    """What one call cost on the wire.

    Attributes:
        sent_nbytes / received_nbytes: HTTP bytes each way (headers and body).
        elapsed_ms: From the first byte sent to the last byte received, connect excluded.
        connect_ms: TCP connect time (0 on a reused connection).
        server_ms: The server's own time for the request (its ``Server-Timing`` total; 0 if absent).
        attempts: Tries it took (1 when the first one answered).
        compute_ms: The model's compute time on the server (``Server-Timing`` compute; 0 if absent).
    """

    sent_nbytes: int
    received_nbytes: int
    elapsed_ms: float
    connect_ms: float
    server_ms: float
    attempts: int
    compute_ms: float = 0.0


def remote_error(
    message: str, *, status: int | None = None, transient: bool = False
) -> RemoteError:
    """A RemoteError carrying the HTTP ``status`` (None: no answer) and whether a retry may help."""
    err = RemoteError(message)
    err.status = status  # type: ignore[attr-defined]
    err.transient = transient  # type: ignore[attr-defined]
    return err


class _Stale(Exception):
    """A reused keep-alive connection the server had closed: retry at once on a new one."""


class OipClient:
    """A thread-safe OIP v2 REST client for one server (``http://host:port[/prefix]``)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        connect_timeout_s: float = 1.0,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.05,
        max_response_nbytes: int = 256 * MB,
    ):
        try:
            u = urlsplit(url if "://" in url else f"http://{url}")
            port = u.port
        except ValueError as e:
            raise RemoteHostError(f"server URL {url[:200]!r}: {e}") from e
        if u.scheme not in ("http", "https") or not u.hostname:
            raise RemoteHostError(f"server URL {url[:200]!r}: expected http://HOST:PORT")
        if token is not None:
            oip.check_bearer_token(token, "the server token (--token or EDGESPLIT_TOKEN)")
        self.url = url
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_response_nbytes = max_response_nbytes
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    # ---- public calls

    def live(self, timeout_s: float | None = None) -> bool:
        try:
            status, _, _, _ = self._call(
                "GET", "/v2/health/live", [], {}, timeout_s, raise_status=False
            )
        except RemoteError:
            return False
        return status == 200

    def ping(self, timeout_s: float | None = None) -> float:
        """Round-trip time of a health request on the kept-alive connection (ms)."""
        return self._call("GET", "/v2/health/live", [], {}, timeout_s)[3].elapsed_ms

    def metadata(self, model: str, timeout_s: float | None = None) -> dict[str, Any]:
        _, _, body, _ = self._call("GET", f"/v2/models/{quote(model)}", [], {}, timeout_s)
        try:
            meta = json.loads(bytes(body))
        except (ValueError, RecursionError) as e:
            raise remote_error(f"{self.url}: model metadata is not valid JSON") from e
        if not isinstance(meta, dict):
            raise remote_error(f"{self.url}: model metadata is not a JSON object")
        return meta

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Iterable[str] | None = None,
        *,
        binary: bool = True,
        timeout_s: float | None = None,
    ) -> tuple[dict[str, np.ndarray], Exchange]:
        """Run ``model`` on the server; returns its outputs (writable arrays) and what the call
        cost."""
        chunks, hlen = oip.encode_request(inputs, outputs, binary=binary)
        headers = {
            "Content-Type": "application/octet-stream" if hlen is not None else "application/json"
        }
        if hlen is not None:
            headers[oip.HEADER_LENGTH] = str(hlen)
        _, rheaders, body, ex = self._call(
            "POST", f"/v2/models/{quote(model)}/infer", chunks, headers, timeout_s
        )
        try:
            out_hlen = oip.parse_header_length(rheaders.get(oip.HEADER_LENGTH.lower()), len(body))
            return oip.decode_response(body, out_hlen), ex
        except Exception as e:  # a server that answers 200 with a body we cannot read
            raise remote_error(f"{self.url}: malformed inference response ({e})") from e

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()

    # ---- transport

    def _call(
        self,
        method: str,
        path: str,
        chunks: list,
        headers: dict[str, str],
        timeout_s: float | None,
        raise_status: bool = True,
    ) -> tuple[int, dict[str, str], bytearray, Exchange]:
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        attempt, failures = 0, 0
        while True:
            attempt += 1
            try:
                status, rheaders, body, ex = self._attempt(method, path, chunks, headers, deadline)
            except _Stale:
                continue  # not a failure of the server: the idle connection had been closed
            except RemoteError as e:
                failures += 1
                if not getattr(e, "transient", False) or not self._pause(failures, 0.0, deadline):
                    raise
                continue
            if status >= 400 and raise_status:
                err = remote_error(
                    f"{self.url}{path}: HTTP {status}: {_error_message(body)}",
                    status=status,
                    transient=status in RETRY_STATUS,
                )
                failures += 1
                wait_s = _retry_after_s(rheaders.get("retry-after"))
                if status not in RETRY_STATUS or not self._pause(failures, wait_s, deadline):
                    raise err
                continue
            return status, rheaders, body, dataclasses.replace(ex, attempts=attempt)

    def _pause(self, failures: int, at_least_s: float, deadline: float) -> bool:
        """Sleep before retry number ``failures``; False (no sleep) when no retry fits the
        deadline."""
        pause = max(self.backoff_s * (2 ** (failures - 1)), at_least_s)
        if failures > self.retries or time.monotonic() + pause >= deadline:
            return False
        time.sleep(pause)
        return True

    def _connection(self, deadline: float) -> tuple[wire.Connection, float]:
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None:
            return conn, 0.0
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise remote_error(f"{self.url}: timed out before connecting", transient=True)
        cls = wire.HTTPSConnection if self._https else wire.Connection
        conn = cls(self._host, self._port, timeout=min(self.connect_timeout_s, remaining))
        t0 = time.perf_counter()
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise remote_error(f"cannot connect to {self.url} ({_why(e)})", transient=True) from e
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn, (time.perf_counter() - t0) * 1e3

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)

    def _attempt(
        self, method: str, path: str, chunks: list, headers: dict[str, str], deadline: float
    ) -> tuple[int, dict[str, str], bytearray, Exchange]:
        conn, connect_ms = self._connection(deadline)
        conn.deadline = deadline
        reused = connect_ms == 0.0
        body_nbytes = sum(len(c) for c in chunks)
        all_headers = {
            "Host": f"{self._host}:{self._port}",
            "Content-Length": str(body_nbytes),
            **self._auth,
            **headers,
        }
        sent = (
            len(method) + len(path) + 12 + sum(len(k) + len(v) + 4 for k, v in all_headers.items())
        )
        got_any = False
        t0 = time.perf_counter()
        try:
            conn.sock.settimeout(wire.remaining_s(deadline))
            conn.putrequest(method, self._prefix + path, skip_host=True, skip_accept_encoding=True)
            for k, v in all_headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            for c in chunks:
                conn.sock.settimeout(
                    wire.remaining_s(deadline)
                )  # sendall's timeout bounds the whole call
                conn.send(c)
            resp = conn.getresponse()  # every read below waits at most until the deadline
            got_any = True
            rheaders = {k.lower(): v for k, v in resp.getheaders()}
            body = wire.read_body(resp, self.max_response_nbytes)
        except TimeoutError as e:
            self._drop(conn)
            raise remote_error(
                f"{self.url}{path}: no answer within the deadline", transient=True
            ) from e
        except wire.TooLarge as e:
            self._drop(conn)
            raise remote_error(f"{self.url}{path}: {e}") from e
        except (OSError, http.client.HTTPException) as e:
            self._drop(conn)
            if (
                reused
                and not got_any
                and isinstance(
                    e, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
                )
            ):
                raise _Stale() from e
            raise remote_error(
                f"{self.url}{path}: connection broke off ({_why(e)})", transient=True
            ) from e
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        if resp.will_close:
            self._drop(conn)
        received = len(body) + 17 + sum(len(k) + len(v) + 4 for k, v in rheaders.items())
        timing = server_timing(rheaders.get("server-timing"))
        server_ms = timing.get("total", next(iter(timing.values()), 0.0))
        return (
            resp.status,
            rheaders,
            body,
            Exchange(
                sent + body_nbytes,
                received,
                elapsed_ms,
                connect_ms,
                server_ms,
                1,
                timing.get("compute", 0.0),
            ),
        )


def server_timing(value: str | None) -> dict[str, float]:
    """The durations of a ``Server-Timing`` header (``compute;dur=1.2, total;dur=1.5``), in ms."""
    found: dict[str, float] = {}
    if not value:
        return found
    for metric in value.split(","):
        name, *params = (p.strip() for p in metric.split(";"))
        for p in params:
            if p.startswith("dur="):
                try:
                    ms = float(p[4:])
                except ValueError:
                    continue
                if 0 <= ms < 1e9:  # a server could send nan, inf or negatives
                    found[name] = ms
    return found


def _retry_after_s(value: str | None) -> float:
    """``Retry-After`` in seconds (0 when absent or an HTTP date: we then use our own backoff)."""
    try:
        s = float(value) if value else 0.0
    except ValueError:
        return 0.0
    return s if 0 <= s < 1e6 else 0.0


def _error_message(body: bytes | bytearray) -> str:
    """The server's error text, short and printable (it reaches terminals and logs)."""
    try:
        msg = json.loads(bytes(body[: 64 << 10])).get("error")
    except (ValueError, AttributeError, RecursionError):
        msg = None
    text = str(msg) if msg else bytes(body[:200]).decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() else " " for ch in text[:200]).strip()
    return text or "no message"


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__
