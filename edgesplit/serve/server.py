"""The offload server: a bundle's server parts over the Open Inference Protocol v2 (REST).

``edgesplit serve BUNDLE`` answers the KServe v2 / Triton REST API with the binary tensor
extension, so ``tritonclient.http`` works against it unchanged. The model name is the part name.
The hot path is aiohttp's HTTP server on one event loop; ONNX Runtime runs on the threads of a
bounded :class:`~edgesplit.serve.compute.ComputeQueue`, and large JSON is decoded and encoded on
threads of its own, so the loop (and every health check) never waits for either. A health probe on
a new connection does not wait for the loop at all: a front door thread answers it
(:mod:`edgesplit.serve.frontdoor`).

Limits (all in :class:`ServeOptions`, all ``serve`` flags): request headers complete within
``header_timeout_s`` of the connection's start (of their first byte on a kept-alive connection),
the body within ``body_timeout_s`` (408 after), an answer sent within ``body_timeout_s``; idle
keep-alive connections closed after ``idle_timeout_s``; at most ``max_connections`` sockets (see
:mod:`edgesplit.serve.guard`); bodies up to ``max_request_nbytes`` (413), all bodies together up
to ``max_inflight_nbytes`` (503 with ``Retry-After``; JSON counts :data:`JSON_WEIGHT` times its
size, what decoding it costs); at most ``max_queue`` requests waiting for compute (503 with
``Retry-After``). A request line without an HTTP version (HTTP/0.9) is refused with 400.

Batching (``max_batch``, ``max_queue_delay_ms``): requests for one part are stacked along the
first dimension and run once, for parts that have a batch-free form (checked by running it when
the server starts, :mod:`edgesplit.bundle.batching`); the others are served one request at a
time and :attr:`OffloadServer.notes` says why. Requests are checked one by one before they join a
batch, so a bad request is refused alone; the stacked copy of a batch's inputs is paid from the
in-flight byte budget (see :class:`~edgesplit.serve.compute.ComputeQueue`).

Security: it binds 127.0.0.1 unless told otherwise; an optional bearer token is compared in
constant time (health endpoints stay open for probes); every error carries ``{"error": "..."}``;
a 500 says only an id, which the server log holds with the traceback. SIGTERM/SIGINT stop
accepting, finish the requests in flight, then exit.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aiohttp import HttpVersion10, web

from edgesplit.bundle.format import open_verified
from edgesplit.errors import BundleError, InputError, RunInputError
from edgesplit.runtime import oip
from edgesplit.runtime.served import ServedModel
from edgesplit.serve.compute import ComputeQueue, QueueFull, QueueStats
from edgesplit.serve.frontdoor import SWITCH_INTERVAL_S
from edgesplit.serve.guard import (
    ByteBudget,
    ConnectionGuard,
    GuardedHandler,
    GuardedSite,
    Reservation,
    default_max_connections,
)
from edgesplit.serve.transfer import (
    LINGER_MAX_NBYTES,
    BufferPool,
    Refused,
    read_body,
    send,
    send_and_close,
)

log = logging.getLogger("edgesplit.serve")

MB = 1 << 20
JSON_WEIGHT = 16  # decoding JSON tensors takes up to ~16x their text in Python objects (measured)
INLINE_JSON_NBYTES = 64 << 10  # JSON headers up to this size are decoded on the loop (about 0.1 ms)


@dataclass(frozen=True)
class ServeOptions:
    """How to serve, and the limits that keep a server up under any client (see the module doc)."""

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_request_nbytes: int = 64 * MB
    all_parts: bool = False
    compute_threads: int | None = None
    intra_op_threads: int | None = None
    shutdown_timeout_s: float = 30.0
    max_inflight_nbytes: int = 256 * MB
    max_connections: int | None = None  # None: what the file-descriptor limit allows, at most 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 30.0
    max_queue: int = 128
    trust_key: str | None = None  # an ed25519 public key file: serve only a bundle signed by it
    max_batch: int = 1  # requests of one part run as one batch at most (1: no batching)
    max_queue_delay_ms: float = 0.0  # how long a batch may wait for more requests
    model_prefix: str = ""  # models are named <prefix>_<part> (a fleet's shared server)
    max_cache_tokens: int | None = None  # a decoder's cache per request (None: the model's)

    def check(self) -> None:
        """Raise :class:`InputError` naming the ``serve`` flag of the first inconsistent limit."""
        if self.max_inflight_nbytes < self.max_request_nbytes:
            raise InputError(
                f"--max-inflight-mb ({self.max_inflight_nbytes / MB:g}) must be at least "
                f"--max-request-mb ({self.max_request_nbytes / MB:g}), or no large request could "
                "be read"
            )
        for flag, value in (
            ("--header-timeout-s", self.header_timeout_s),
            ("--body-timeout-s", self.body_timeout_s),
            ("--idle-timeout-s", self.idle_timeout_s),
        ):
            if not 0 < value < float("inf"):
                raise InputError(f"{flag} must be a positive number of seconds, not {value}")
        if self.token is not None:
            oip.check_bearer_token(self.token, "--token")
        oip.check_model_prefix(self.model_prefix, "--model-prefix")
        if self.max_cache_tokens is not None and self.max_cache_tokens < 1:
            raise InputError(f"--max-cache-tokens must be at least 1, not {self.max_cache_tokens}")
        if self.max_batch < 1:
            raise InputError(f"--max-batch must be at least 1, not {self.max_batch}")
        if not 0 <= self.max_queue_delay_ms < 60_000:
            raise InputError(
                "--max-queue-delay-ms must be between 0 and 60000 ms, not "
                f"{self.max_queue_delay_ms}"
            )


@dataclass(frozen=True)
class ServerStats:
    """What the limits did so far: connections, bytes in flight, the compute queue."""

    connections: int
    connections_busy: int
    connections_evicted: int
    connections_refused: int
    header_timeouts: int
    inflight_nbytes: int
    inflight_peak_nbytes: int
    queue: QueueStats
    health_fast_answers: int  # health probes the front door answered off the event loop


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


class OffloadServer:
    """The OIP v2 application over a verified bundle. Use :meth:`serve` or :class:`ServerThread`."""

    def __init__(self, bundle: str | os.PathLike, options: ServeOptions = ServeOptions()):
        options.check()
        self.bundle = Path(bundle)
        self.options = options
        verified = open_verified(self.bundle, trust_key=options.trust_key)  # before any model loads
        manifest = verified.manifest
        parts = [p for p in manifest.parts if p.remote or options.all_parts]
        if not parts:
            raise BundleError(
                f"{self.bundle}: no server parts to serve (remote=True); use --all-parts to serve "
                "every part"
            )
        workers = options.compute_threads or max(2, os.cpu_count() or 2)
        intra = options.intra_op_threads
        if intra is None and options.max_batch > 1:
            # batches are large enough for ORT's pool: share the cores among the compute threads
            # rather than let each pool take them all (measured: 2 pools of 2 threads on 2 cores
            # ran batches of 8 tiny_dag requests 10-30x slower than one thread each)
            intra = max(1, (os.cpu_count() or 1) // workers)
        served = [
            ServedModel(
                p,
                verified,
                intra,
                options.max_batch,
                oip.served_name(p.name, options.model_prefix),
                options.max_cache_tokens,
            )
            for p in parts
        ]
        self.models = {m.name: m for m in served}
        self.notes = [m.note for m in self.models.values() if m.note]
        self._token = options.token.encode() if options.token else None
        self.budget = ByteBudget(options.max_inflight_nbytes)
        self.compute = ComputeQueue(
            workers,
            options.max_queue,
            max_batch=options.max_batch,
            max_delay_s=options.max_queue_delay_ms / 1e3,
            budget=self.budget,
        )
        self._codec_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="edgesplit-json")
        self._pool = BufferPool(self.budget)
        self.connections = ConnectionGuard(
            options.max_connections or default_max_connections(), options.header_timeout_s
        )
        self._ready = False
        self._runner: web.AppRunner | None = None
        self._site: GuardedSite | None = None
        self.port: int | None = None

    def stats(self) -> ServerStats:
        c, b = self.connections, self.budget
        return ServerStats(
            c.open,
            c.in_request,
            c.evicted,
            c.refused,
            c.header_timeouts,
            b.used_nbytes,
            b.peak_nbytes,
            self.compute.stats(),
            self._site.front_door.answered if self._site and self._site.front_door else 0,
        )

    # ---- the application

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._middleware], client_max_size=self.options.max_request_nbytes
        )
        r = app.router
        r.add_get("/v2/health/live", self._live)
        r.add_get("/v2/health/ready", self._ready_h)
        r.add_get("/v2", self._server_meta)
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            r.add_get(prefix, self._model_meta)
            r.add_get(prefix + "/ready", self._model_ready)
            r.add_post(prefix + "/infer", self._infer)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if request.version < HttpVersion10:
            # A request line without a version (HTTP/0.9): aiohttp's C parser takes it, its Python
            # parser refuses it with 400. Refused here whichever parser runs.
            line = f"{request.method} {request.raw_path}"[:100]
            resp = _error(400, f"bad request: no HTTP version in the request line {line!r}")
            resp.force_close()
            return resp
        self.connections.request_started(request.protocol)
        try:
            return await self._answer(request, handler)
        finally:
            self.connections.request_finished(request.protocol)

    async def _answer(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            self._authorize(request)
            return await handler(request)
        except RunInputError as e:
            return _error(400, str(e))
        except QueueFull as e:
            return _error(503, str(e), **{"Retry-After": str(e.retry_after_s)})
        except Refused as e:
            resp = _error(e.status, str(e), **e.headers)
            if (
                e.close
            ):  # the rest of the body is not read: answer, then close (aiohttp would drain it)
                await send_and_close(request, resp)
            return resp
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method
            if e.status < 400:
                raise
            return _error(e.status, e.reason)
        except Exception as e:  # noqa: BLE001 - answer 500 without internals and keep serving
            eid = uuid.uuid4().hex[:12]
            log.error(
                "internal error %s on %s %s", eid, request.method, request.path[:200], exc_info=e
            )
            return _error(500, f"internal error (id {eid}); the server log has the details")

    def _authorize(self, request: web.Request) -> None:
        if self._token is None or request.path.startswith("/v2/health/"):
            return
        try:  # aiohttp decodes header bytes as UTF-8 with surrogate escapes
            auth = request.headers.get("Authorization", "").encode("utf-8")
        except UnicodeEncodeError:
            raise RunInputError("the Authorization header is not valid UTF-8") from None
        scheme, _, given = auth.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self._token):
            raise Refused(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})

    def _model(self, request: web.Request) -> ServedModel:
        name = request.match_info["name"]
        model = self.models.get(name)
        version = request.match_info.get("version")
        if model is None or version not in (None, "", "1"):
            raise Refused(
                404, f"no model '{name[:64]}'" + (f" version {version[:16]}" if version else "")
            )
        return model

    async def _live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def _ready_h(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": self._ready}, status=200 if self._ready else 503)

    async def _server_meta(self, request: web.Request) -> web.Response:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("edgesplit")
        except PackageNotFoundError:
            v = "0"
        return web.json_response(
            {"name": "edgesplit", "version": v, "extensions": ["binary_tensor_data"]}
        )

    async def _model_meta(self, request: web.Request) -> web.Response:
        return web.json_response(self._model(request).metadata)

    async def _model_ready(self, request: web.Request) -> web.Response:
        self._model(request)
        return web.json_response({"ready": self._ready}, status=200 if self._ready else 503)

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        model = self._model(request)
        held = self.budget.reservation()
        body: memoryview | None = None
        reusable = True
        try:
            body = await read_body(
                request, self.options, held, self._head_check(request, model), self._pool
            )
            t0 = time.perf_counter()
            req = await self._decode(request, body, held)
            feeds = model.check(req)
            names = list(req.outputs) if req.outputs is not None else model.output_names
            job = await self.compute.submit_job(model, feeds, names)
            outputs, compute_ms = job.done.result()
            binary = (
                req.binary_outputs
                if req.outputs is not None
                else (names if req.binary_default else ())
            )
            if set(names) <= set(binary):
                chunks, out_hlen = oip.encode_response(
                    model.name, outputs, binary, request_id=req.id
                )
            else:  # JSON values: tolist() and dumps() of a large output would hold the loop
                chunks, out_hlen = await asyncio.get_running_loop().run_in_executor(
                    self._codec_pool, _encode, model.name, outputs, binary, req.id
                )
            total_ms = (time.perf_counter() - t0) * 1e3
            headers = {
                "Server-Timing": f"compute;dur={compute_ms:.3f}, total;dur={total_ms:.3f}, "
                f'batch;desc="{job.batch_id}x{job.batch_size}"'
            }
            if out_hlen is not None:
                headers[oip.HEADER_LENGTH] = str(out_hlen)
            content_type = (
                "application/octet-stream" if out_hlen is not None else "application/json"
            )
            return await send(request, chunks, headers, content_type, self.options.body_timeout_s)
        except asyncio.CancelledError:
            reusable = False  # a compute thread may still be reading the inputs, views of the body
            raise
        finally:
            held.release()
            if body is not None and reusable:
                self._pool.give(body)

    def _head_check(self, request: web.Request, model: ServedModel):
        """For a binary request with a small JSON header: check the header before the tensors are
        read."""
        value, length = request.headers.get(oip.HEADER_LENGTH), request.content_length
        if request.headers.get("Content-Encoding", "identity") != "identity":
            return None
        if length is not None and length > self.options.max_request_nbytes:
            return None  # read_body refuses it by its size
        if value is None:  # all JSON: refuse at once what could never be decoded within the limit
            if length is not None and length * JSON_WEIGHT > self.budget.limit_nbytes:
                raise Refused(
                    413,
                    f"a JSON request of {length} bytes needs {JSON_WEIGHT}x that to decode, over "
                    "the "
                    f"in-flight limit of {self.budget.limit_nbytes} bytes: send tensors as binary "
                    "data",
                    close=length > LINGER_MAX_NBYTES,
                )
            return None
        hlen = oip.parse_header_length(
            value, self.options.max_request_nbytes if length is None else length
        )
        return (
            (hlen, model.check_declared)
            if hlen is not None and hlen <= INLINE_JSON_NBYTES
            else None
        )

    async def _decode(
        self, request: web.Request, body: memoryview, held: Reservation
    ) -> oip.InferRequest:
        hlen = oip.parse_header_length(request.headers.get(oip.HEADER_LENGTH), len(body))
        json_nbytes = len(body) if hlen is None else hlen
        extra = json_nbytes * (JSON_WEIGHT - 1)
        if not held.take(extra):
            if held.nbytes + extra > self.budget.limit_nbytes:
                raise Refused(
                    413,
                    f"a JSON request header of {json_nbytes} bytes needs {JSON_WEIGHT}x that to "
                    "decode, over "
                    f"the in-flight limit of {self.budget.limit_nbytes} bytes: send tensors as "
                    "binary data",
                )
            raise Refused(
                503, "too many request bytes in flight; retry later", {"Retry-After": "1"}
            )
        if json_nbytes <= INLINE_JSON_NBYTES:
            return oip.decode_request(body, hlen)
        return await asyncio.get_running_loop().run_in_executor(
            self._codec_pool, oip.decode_request, body, hlen
        )

    # ---- running

    async def start(self) -> int:
        """Start listening; returns the bound port (``port=0`` picks a free one)."""
        self._runner = web.AppRunner(
            self.app(), access_log=None, shutdown_timeout=self.options.shutdown_timeout_s
        )
        await self._runner.setup()
        loop, manager, o = asyncio.get_running_loop(), self._runner.server, self.options
        assert manager is not None

        def connection() -> GuardedHandler:
            return GuardedHandler(
                self.connections,
                manager,
                loop=loop,
                keepalive_timeout=o.idle_timeout_s,
                access_log=None,
                lingering_time=min(10.0, o.body_timeout_s),
            )

        self._site = GuardedSite(self._runner, o.host, o.port, connection, lambda: self._ready)
        await self._site.start()
        self.port = self._site.bound_port
        self.compute.start()
        self._ready = True
        return self.port

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight finish, then free the compute threads."""
        self._ready = False
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.compute.close()
        self._codec_pool.shutdown(wait=True)

    def serve(self, on_ready: Callable[[str, int], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully."""

        # the process is the server's: the front door thread gets the GIL from a busy loop sooner
        sys.setswitchinterval(SWITCH_INTERVAL_S)

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            port = await self.start()
            if on_ready:
                on_ready(self.options.host, port)
            await stop.wait()
            await self.stop()

        asyncio.run(main())


def _encode(model_name: str, outputs, binary, request_id):
    return oip.encode_response(model_name, outputs, binary, request_id=request_id)


class ServerThread:
    """An :class:`OffloadServer` on its own event loop in a background thread (tests,
    benchmarks)."""

    def __init__(self, bundle: str | os.PathLike, options: ServeOptions = ServeOptions(port=0)):
        self.server = OffloadServer(bundle, options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="edgesplit-server", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.server.options.host}:{self.server.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The server's event loop (running on the thread)."""
        return self._loop

    def __enter__(self) -> ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=30)
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(
                timeout=self.server.options.shutdown_timeout_s + 5
            )
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()

    def __exit__(self, *exc: object) -> None:
        self.close()
