"""The offload server: a bundle's server parts over the Open Inference Protocol v2 (REST).

``edgesplit serve BUNDLE`` answers the KServe v2 / Triton REST API with the binary tensor
extension, so ``tritonclient.http`` works against it unchanged. The model name is the part name.
The hot path is aiohttp's HTTP server on one event loop; ONNX Runtime runs in a thread pool so the
loop never blocks, and requests run concurrently (one ORT session per part is thread-safe).

Security and robustness: it binds 127.0.0.1 unless told otherwise; an optional bearer token is
compared in constant time (health endpoints stay open for probes); bodies above the size limit
get 413 before they are read; every 4xx carries ``{"error": "..."}``; SIGTERM/SIGINT stop
accepting, finish the requests in flight, then exit.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import PayloadEncodingError
from aiohttp.web_protocol import RequestPayloadError

from edgesplit.compile.bundle import PartArtifact, VerifiedBundle, open_verified
from edgesplit.errors import BundleError, RunInputError
from edgesplit.runtime import oip

log = logging.getLogger("edgesplit.serve")

MB = 1 << 20
_ENCODINGS = ("identity", "gzip", "deflate")


@dataclass(frozen=True)
class ServeOptions:
    """How to serve. ``max_request_nbytes`` bounds a request body, decompressed too."""

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_request_nbytes: int = 64 * MB
    all_parts: bool = False
    compute_threads: int | None = None
    intra_op_threads: int | None = None
    shutdown_timeout_s: float = 30.0
    trust_key: str | None = None  # an ed25519 public key file: serve only a bundle signed by it


class ServedModel:
    """One part behind ``/v2/models/{name}``: its ORT session, specs and metadata."""

    def __init__(self, part: PartArtifact, bundle: VerifiedBundle, intra_op_threads: int | None):
        import onnxruntime as ort

        self.part = part
        self.name = part.name
        from edgesplit.cpu import ort_session_options

        # the server processor's threads, as planned
        so = ort_session_options(intra_op_threads or part.threads, None)
        available = ort.get_available_providers()
        # The part was planned for a server processor (a GPU, say); serve it with that provider
        # when this onnxruntime has it, else on the CPU, and say so.
        provider = part.provider if part.provider in available else "CPUExecutionProvider"
        self.note = (
            "" if provider == part.provider else f"{part.name}: no {part.provider} here, serving on CPU"
        )
        providers: list[Any] = [(provider, dict(part.provider_options) if provider == part.provider else {})]
        if provider != "CPUExecutionProvider":
            providers.append(("CPUExecutionProvider", {}))
        # from the bytes checked against the manifest as they were read
        self.session = ort.InferenceSession(bundle.read(part.onnx_file), so, providers=providers)
        self.inputs = {t.name: t for t in part.inputs}
        self.output_names = [t.name for t in part.outputs]
        self.metadata = {
            "name": part.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [_spec_json(t) for t in part.inputs],
            "outputs": [_spec_json(t) for t in part.outputs],
        }

    def check(self, req: oip.InferRequest) -> dict[str, np.ndarray]:
        """The request's inputs, checked against the part's names, datatypes and shapes."""
        unknown = [n for n in req.inputs if n not in self.inputs]
        missing = [n for n in self.inputs if n not in req.inputs]
        if unknown or missing:
            raise RunInputError(
                f"model '{self.name}' takes inputs {', '.join(self.inputs)}"
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
                + (f"; missing {', '.join(missing)}" if missing else "")
            )
        for name, spec in self.inputs.items():
            arr = req.inputs[name]
            if arr.dtype != np.dtype(spec.dtype):
                raise RunInputError(
                    f"input '{name}': datatype {oip.oip_datatype(arr.dtype)}, "
                    f"expected {oip.oip_datatype(spec.dtype)}"
                )
            if tuple(arr.shape) != tuple(spec.shape):
                raise RunInputError(f"input '{name}': shape {list(arr.shape)}, expected {list(spec.shape)}")
        if req.outputs is not None:
            bad = [n for n in req.outputs if n not in self.output_names]
            if bad:
                raise RunInputError(
                    f"model '{self.name}' has no output {', '.join(bad)} (has {', '.join(self.output_names)})"
                )
        return dict(req.inputs)

    def run(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> tuple[dict[str, np.ndarray], float]:
        t0 = time.perf_counter()
        got = self.session.run(names, dict(feeds))
        return dict(zip(names, got)), (time.perf_counter() - t0) * 1e3


def _spec_json(t) -> dict[str, Any]:
    return {"name": t.name, "datatype": oip.oip_datatype(t.dtype), "shape": list(t.shape)}


class _Refused(Exception):
    """A request we answer with ``status`` and a JSON message (never echoed into HTTP headers)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


class OffloadServer:
    """The OIP v2 application over a verified bundle. Use :meth:`serve` or :class:`ServerThread`."""

    def __init__(self, bundle: str | os.PathLike, options: ServeOptions = ServeOptions()):
        self.bundle = Path(bundle)
        self.options = options
        verified = open_verified(self.bundle, trust_key=options.trust_key)  # before any model loads
        manifest = verified.manifest
        parts = [p for p in manifest.parts if p.remote or options.all_parts]
        if not parts:
            raise BundleError(
                f"{self.bundle}: no server parts to serve (remote=True); use --all-parts to serve every part"
            )
        self.models = {p.name: ServedModel(p, verified, options.intra_op_threads) for p in parts}
        self.notes = [m.note for m in self.models.values() if m.note]
        self._token = options.token.encode() if options.token else None
        self._pool = ThreadPoolExecutor(
            max_workers=options.compute_threads or max(2, os.cpu_count() or 2),
            thread_name_prefix="edgesplit-serve",
        )
        self._ready = False
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ---- the application

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=self.options.max_request_nbytes)
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
    async def _guard(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self._token is not None and not request.path.startswith("/v2/health/"):
            auth = request.headers.get("Authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
                return _error(401, "missing or wrong bearer token", **{"WWW-Authenticate": "Bearer"})
        try:
            return await handler(request)
        except RunInputError as e:
            return _error(400, str(e))
        except _Refused as e:
            resp = _error(e.status, str(e))
            if e.status == 413:
                resp.force_close()  # the rest of the body is not read: this connection is done
            return resp
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method, body too large
            if e.status < 400:
                raise
            resp = _error(e.status, str(e.text or e.reason) if e.status == 413 else e.reason)
            if e.status == 413:
                resp.force_close()
            return resp
        except Exception as e:  # noqa: BLE001 - answer 500 and keep serving
            log.exception("internal error on %s", request.path)
            return _error(500, f"internal error: {type(e).__name__}: {e}")

    def _model(self, request: web.Request) -> ServedModel:
        name = request.match_info["name"]
        model = self.models.get(name)
        version = request.match_info.get("version")
        if model is None or version not in (None, "", "1"):
            raise _Refused(404, f"no model '{name}'" + (f" version {version}" if version else ""))
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
        return web.json_response({"name": "edgesplit", "version": v, "extensions": ["binary_tensor_data"]})

    async def _model_meta(self, request: web.Request) -> web.Response:
        return web.json_response(self._model(request).metadata)

    async def _model_ready(self, request: web.Request) -> web.Response:
        self._model(request)
        return web.json_response({"ready": self._ready}, status=200 if self._ready else 503)

    async def _infer(self, request: web.Request) -> web.Response:
        model = self._model(request)
        limit = self.options.max_request_nbytes
        if request.content_length is not None and request.content_length > limit:
            raise _Refused(
                413, f"request body of {request.content_length} bytes is over the limit of {limit} bytes"
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in _ENCODINGS:  # aiohttp inflates gzip and deflate itself, bounded by the limit
            raise _Refused(
                415, f"unsupported Content-Encoding {encoding[:40]!r} (use {', '.join(_ENCODINGS)})"
            )
        try:
            body = await request.read()
        except (PayloadEncodingError, RequestPayloadError) as e:
            raise RunInputError(f"the body is not valid {encoding} data ({e})") from e
        t0 = time.perf_counter()
        hlen = oip.parse_header_length(request.headers.get(oip.HEADER_LENGTH), len(body))
        req = oip.decode_request(body, hlen)
        feeds = model.check(req)
        names = list(req.outputs) if req.outputs is not None else model.output_names
        outputs, compute_ms = await asyncio.get_running_loop().run_in_executor(
            self._pool, model.run, feeds, names
        )
        binary = req.binary_outputs if req.outputs is not None else (names if req.binary_default else ())
        chunks, out_hlen = oip.encode_response(model.name, outputs, binary, request_id=req.id)
        headers = {
            "Server-Timing": f"compute;dur={compute_ms:.3f}, total;dur={(time.perf_counter() - t0) * 1e3:.3f}"
        }
        if out_hlen is not None:
            headers[oip.HEADER_LENGTH] = str(out_hlen)
            content_type = "application/octet-stream"
        else:
            content_type = "application/json"
        return web.Response(body=b"".join(chunks), headers=headers, content_type=content_type)

    # ---- running

    async def start(self) -> int:
        """Start listening; returns the bound port (``port=0`` picks a free one)."""
        self._runner = web.AppRunner(
            self.app(), access_log=None, shutdown_timeout=self.options.shutdown_timeout_s
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port, reuse_address=True)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = int(sock.getsockname()[1])
        self._ready = True
        return self.port

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight finish, then free the compute threads."""
        self._ready = False
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._pool.shutdown(wait=True)

    def serve(self, on_ready: Callable[[str, int], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully."""

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


class ServerThread:
    """An :class:`OffloadServer` on its own event loop in a background thread (tests, benchmarks)."""

    def __init__(self, bundle: str | os.PathLike, options: ServeOptions = ServeOptions(port=0)):
        self.server = OffloadServer(bundle, options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edgesplit-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.server.options.host}:{self.server.port}"

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
