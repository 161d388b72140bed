"""Hostile servers against the offload client (``run --server``): a real TCP server written here
answers health checks honestly and every inference request with a lie: a false Content-Length, a
trickle, a stall, garbage, a connection closed mid-body, huge or endless headers.

Expected outcome of every case: the remote part falls back to its local artifact and the run returns
the right output within the call's deadline (or, without a fallback, raises a clear RemoteError);
never a hang, a MemoryError or a raw exception. Each test runs under pytest-timeout.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from netlab import make_bundle, single_tensor_cuts

from edgesplit.errors import InputError, RemoteError, RemoteHostError
from edgesplit.runtime import oip
from edgesplit.runtime.session import load

pytestmark = pytest.mark.timeout(60)

DEADLINE_S = (
    1.0  # the call's deadline, where the lie ends in an error of its own (a limit, a close)
)
STALL_DEADLINE_S = 0.4  # where only the deadline ends the call ("no answer within the deadline")


def deadline_for(words: str) -> float:
    return STALL_DEADLINE_S if "within the deadline" in words else DEADLINE_S


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """tiny_dag cut in the middle; p1 is a server part with a local fallback (and a copy
    without)."""
    from edgesplit.model import zoo

    d = tmp_path_factory.mktemp("hostile_client")
    model = zoo.save("tiny_dag", d / "tiny_dag.onnx")
    cuts = single_tensor_cuts(onnx.load(model))
    cut = cuts[len(cuts) // 2]
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    return {
        "bundle": make_bundle(model, d / "bundle", [cut], [False, True]),
        "nofallback": make_bundle(model, d / "nofallback", [cut], [False, True], fallback=False),
        "x": x,
        "y": ort.InferenceSession(str(model)).run(None, {"input": x})[0],
        "p1": ort.InferenceSession(str(d / "bundle/parts/p1.onnx")),
    }


# ---- the fake server

Lie = Callable[[socket.socket, threading.Event, bytes, dict], None]


class FakeServer:
    """A real socket server on 127.0.0.1: ``GET`` gets an honest ``{"live": true}`` (so the client's
    health pings pass), every ``POST`` gets ``lie(conn, stop, body, headers)``; then the connection
    closes."""

    def __init__(self, lie: Lie):
        self.lie = lie
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.posts = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buf = b""
        try:
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buf:
                    try:
                        data = conn.recv(1 << 16)
                    except TimeoutError:
                        if self.stop.is_set():
                            return
                        continue
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (h.partition(":") for h in lines[1:])
                }
                n = int(headers.get("content-length", 0))
                while len(buf) < n:
                    try:
                        buf += conn.recv(1 << 16)
                    except TimeoutError:
                        continue
                body, buf = buf[:n], buf[n:]
                if lines[0].startswith("GET"):
                    conn.sendall(answer(200, b'{"live": true}'))
                    continue
                self.posts += 1
                self.lie(conn, self.stop, body, headers)
                return
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress (Linux)
        self.listener.close()
        for c in self.conns:
            c.close()
        self._thread.join(5)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    h = {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode("latin-1") + body


def hold(stop: threading.Event) -> None:
    stop.wait(30)


def trickle(conn: socket.socket, stop: threading.Event, unit: bytes, every_s: float = 0.05) -> None:
    while not stop.is_set():
        conn.sendall(unit)
        time.sleep(every_s)


# ---- the lies: name -> (what the server does, words of the error the client records)

LIES: dict[str, tuple[Lie, str]] = {
    "Content-Length 100000000000": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\nxx"),
            hold(stop),
        ),
        "declares 100000000000 bytes, over the limit",
    ),
    "Content-Length 1e11 (not an integer)": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1e11\r\n\r\n"),
            trickle(c, stop, b"x" * (1 << 16), 0),
        ),
        "runs past the limit",
    ),
    "negative Content-Length, then endless bytes": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n"),
            trickle(c, stop, b"x" * (1 << 16), 0),
        ),
        "runs past the limit",
    ),
    "chunked answer trickled a byte at a time": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            trickle(c, stop, b"1\r\nx\r\n"),
        ),
        "no answer within the deadline",
    ),
    "chunk-size line trickled for ever": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            trickle(c, stop, b"0"),
        ),
        "no answer within the deadline",
    ),
    "endless fast chunks": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            trickle(c, stop, b"10000\r\n" + b"x" * 0x10000 + b"\r\n", 0),
        ),
        "runs past the limit",
    ),
    "headers trickled for ever": (
        lambda c, stop, b, h: (c.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: "), trickle(c, stop, b"a")),
        "no answer within the deadline",
    ),
    "status line trickled": (
        lambda c, stop, b, h: trickle(c, stop, b"H", 0.1),
        "no answer within the deadline",
    ),
    "body trickled under a true Content-Length": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"),
            trickle(c, stop, b"x"),
        ),
        "no answer within the deadline",
    ),
    "endless 100 Continue": (
        lambda c, stop, b, h: trickle(c, stop, b"HTTP/1.1 100 Continue\r\n\r\n", 0.001),
        "no answer within the deadline",
    ),
    "never answers": (lambda c, stop, b, h: hold(stop), "no answer within the deadline"),
    "stalls after the headers": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789"),
            hold(stop),
        ),
        "no answer within the deadline",
    ),
    "garbage instead of HTTP": (
        lambda c, stop, b, h: c.sendall(b"\x00\xffSSH-2.0-garbage\r\n\r\n"),
        "connection broke off",
    ),
    "closes in the middle of the body": (
        lambda c, stop, b, h: c.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789"
        ),
        "connection broke off",
    ),
    "closes without a word": (lambda c, stop, b, h: None, "connection broke off"),
    "a header line of 100 KB": (
        lambda c, stop, b, h: (
            c.sendall(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"),
            hold(stop),
        ),
        "connection broke off",
    ),
    "1000 headers": (
        lambda c, stop, b, h: (
            c.sendall(
                b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(1000)) + b"\r\n"
            ),
            hold(stop),
        ),
        "connection broke off",
    ),
    "JSON nesting bomb as the answer": (
        lambda c, stop, b, h: c.sendall(answer(200, b"[" * 100_000)),
        "malformed inference response",
    ),
    "header length past the body": (
        lambda c, stop, b, h: c.sendall(answer(200, b"{}", {oip.HEADER_LENGTH: "99999"})),
        "malformed inference response",
    ),
    "output of the wrong shape": (
        lambda c, stop, b, h: c.sendall(
            answer(
                200,
                *framed(
                    oip.encode_response("p1", {"logits": np.zeros((1, 5), np.float32)}, ["logits"])
                ),
            )
        ),
        "expected float32[1, 10]",
    ),
    "503 with Retry-After of an hour": (
        lambda c, stop, b, h: c.sendall(answer(503, b'{"error": "busy"}', {"Retry-After": "3600"})),
        "HTTP 503: busy",
    ),
    "redirect elsewhere": (
        lambda c, stop, b, h: c.sendall(answer(302, b"", {"Location": "http://203.0.113.1/"})),
        "malformed inference response",
    ),
}


def framed(encoded: tuple[list, int | None]) -> tuple[bytes, dict[str, str]]:
    chunks, hlen = encoded
    return b"".join(bytes(c) for c in chunks), (
        {oip.HEADER_LENGTH: str(hlen)} if hlen is not None else {}
    )


def run_against(bundle, url: str, x: np.ndarray, **remote) -> tuple[np.ndarray, object]:
    opts = {"remote": {"url": url, "timeout_s": DEADLINE_S, **remote}}
    with load(bundle, executor_options=opts) as sess:
        out = sess.run({"input": x}, timeout_s=30)["logits"]
        return out, sess.remote_stats()["p1"]


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_server_makes_the_part_fall_back_with_the_right_output(tiny, lie):
    behave, words = LIES[lie]
    with FakeServer(behave) as fake:
        out, stats = run_against(tiny["bundle"], fake.url, tiny["x"], timeout_s=deadline_for(words))
        assert fake.posts >= 1  # the lie was told, not skipped by a cool-down
    np.testing.assert_allclose(out, tiny["y"], rtol=1e-5, atol=1e-5)
    assert stats.remote_runs == 0 and stats.local_runs == 1 and stats.failures == 1
    assert words in stats.last_error, stats.last_error


def test_defect7_content_length_1e11_does_not_raise_memoryerror(tiny):
    behave, _ = LIES["Content-Length 100000000000"]
    with FakeServer(behave) as fake:
        out, stats = run_against(tiny["bundle"], fake.url, tiny["x"])
    np.testing.assert_allclose(out, tiny["y"], rtol=1e-5, atol=1e-5)
    assert "over the limit" in stats.last_error


def test_defect7_a_trickled_chunked_answer_ends_at_the_deadline(tiny):
    """The old client read chunked answers with per-read timeouts only: a byte every 50 ms kept it
    waiting for ever. Now the call's deadline (0.4 s) covers every read, then the part falls
    back."""
    behave, _ = LIES["chunked answer trickled a byte at a time"]
    with FakeServer(behave) as fake:
        t0 = time.monotonic()
        out, stats = run_against(tiny["bundle"], fake.url, tiny["x"], timeout_s=STALL_DEADLINE_S)
        took_s = time.monotonic() - t0
    np.testing.assert_allclose(out, tiny["y"], rtol=1e-5, atol=1e-5)
    assert "no answer within the deadline" in stats.last_error
    assert took_s < 20, took_s  # a hang guard, not a speed figure: the deadline is 0.4 s


def test_without_a_fallback_a_lie_is_a_clear_remote_error(tiny):
    behave, _ = LIES["chunked answer trickled a byte at a time"]
    with FakeServer(behave) as fake:
        opts = {"remote": {"url": fake.url, "timeout_s": STALL_DEADLINE_S}}
        with load(tiny["nofallback"], executor_options=opts) as sess:
            with pytest.raises(RemoteError, match=r"part p1: .*no answer within the deadline"):
                sess.run({"input": tiny["x"]}, timeout_s=30)


def test_a_refusal_is_an_error_not_a_fallback_and_its_text_is_cleaned(tiny):
    hostile = "\x1b[31mrm -rf /\x1b[0m\r\n" + "A" * 10_000
    behave = lambda c, stop, b, h: c.sendall(answer(401, json.dumps({"error": hostile}).encode()))  # noqa: E731
    with FakeServer(behave) as fake:
        opts = {"remote": {"url": fake.url, "timeout_s": DEADLINE_S}}
        with load(tiny["bundle"], executor_options=opts) as sess:
            with pytest.raises(RemoteHostError, match="HTTP 401") as e:
                sess.run({"input": tiny["x"]}, timeout_s=30)
    message = str(e.value)
    assert "\x1b" not in message and "\r" not in message and "\n" not in message
    assert len(message) < 400


def honest(tiny, chunk_nbytes: int | None = None, extra: dict[str, str] | None = None) -> Lie:
    """An honest answer computed by the real part, framed as asked (chunked in pieces of
    ``chunk_nbytes``)."""

    def behave(c: socket.socket, stop: threading.Event, body: bytes, headers: dict) -> None:
        req = oip.decode_request(
            body, oip.parse_header_length(headers.get(oip.HEADER_LENGTH.lower()), len(body))
        )
        y = tiny["p1"].run(None, dict(req.inputs))[0]
        data, h = framed(oip.encode_response("p1", {"logits": y}, ["logits"]))
        h = {**h, **(extra or {})}
        if chunk_nbytes is None:
            c.sendall(answer(200, data, h))
            return
        head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in h.items()
        )
        c.sendall(head.encode() + b"\r\n")
        for i in range(0, len(data), chunk_nbytes):
            piece = data[i : i + chunk_nbytes]
            c.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        c.sendall(b"0\r\n\r\n")

    return behave


def test_an_honest_chunked_answer_with_odd_timing_headers_is_accepted(tiny):
    timing = {"Server-Timing": "compute;dur=nan, total;dur=-inf"}
    with FakeServer(honest(tiny, chunk_nbytes=7, extra=timing)) as fake:
        out, stats = run_against(tiny["bundle"], fake.url, tiny["x"])
    np.testing.assert_allclose(out, tiny["y"], rtol=1e-5, atol=1e-5)
    assert stats.remote_runs == 1 and stats.local_runs == 0
    assert stats.server_ms_median == 0.0  # nan and -inf were ignored, not averaged in


@pytest.mark.parametrize("token", ["a\r\nX-Injected: 1", "tab\there", "caf\u00e9", ""])
def test_a_token_that_cannot_go_in_a_header_is_refused_clearly(tiny, token):
    with pytest.raises(
        InputError, match="server token .*(carriage return|control character|non-ASCII|is empty)"
    ):
        load(
            tiny["bundle"],
            executor_options={"remote": {"url": "http://127.0.0.1:9", "token": token}},
        )


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "edgesplit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_run_deadline_ms_from_the_cli_ends_a_stalled_call_in_a_fallback(tiny):
    with FakeServer(LIES["never answers"][0]) as fake:
        r = cli(
            "run",
            str(tiny["bundle"]),
            "--server",
            fake.url,
            "--deadline-ms",
            "300",
            "--repeat",
            "2",
            "--warmup",
            "0",
        )
    assert r.returncode == 0, r.stderr
    assert "ort-fallback" in r.stdout and "no answer within" in r.stdout


@pytest.mark.slow
def test_run_cli_refuses_a_deadline_without_a_server_and_a_bad_token(tiny):
    r = cli("run", str(tiny["bundle"]), "--deadline-ms", "300")
    assert r.returncode == 2 and "--deadline-ms" in r.stderr and "Traceback" not in r.stderr
    r = cli(
        "run",
        str(tiny["bundle"]),
        "--server",
        "http://127.0.0.1:9",
        env={"EDGESPLIT_TOKEN": "a\r\nb"},
    )
    assert r.returncode == 2 and "carriage return" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
