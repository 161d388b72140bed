"""onnxslim in a child process, so that folding that does not end can be stopped.

onnxslim folds constant subgraphs by running them in ONNX Runtime; a ``Loop`` of constants with
a trip count of ``10**15`` never ends there, and a call into ORT cannot be interrupted from
another thread. So it runs in a child process, started on first use and kept for the next model;
at the stage's deadline the child is killed, and a new one starts the next time. The child runs
this module's source and needs no edgesplit package (the profiling agent runs from a zipapp).
Importing onnxslim there rather than here costs about the same (0.4 s in a fresh process), and a
model that was simplified before comes from the cache (:mod:`edgesplit.model.kept`) without it.

Protocol, over the child's stdin and stdout: each message is a JSON header then a payload, each
preceded by its length (8 bytes, little-endian). Request ``{"input_shapes": [...]}`` + the model's
bytes; answer ``{"error": null | "first line of onnxslim's error"}`` + the simplified model's bytes.
No pickle: JSON and ONNX bytes only.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import struct
import subprocess
import sys
import threading
import time
from typing import BinaryIO

_LEN = struct.Struct("<Q")


class SlimTimeout(Exception):
    """The child gave no answer before the deadline; it was killed."""


class SlimCrashed(Exception):
    """The child died (a crash in onnxslim or ORT) before answering."""


def _write(f: BinaryIO, header: dict, payload: bytes) -> None:
    head = json.dumps(header).encode()
    f.write(_LEN.pack(len(head)) + head + _LEN.pack(len(payload)))
    f.write(payload)
    f.flush()


class SlimWorker:
    """The child process, started on first use; one request at a time."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            # this module's own source, run as the child's main: it needs no edgesplit package
            # (the profiling agent runs from a zipapp that a ``-m`` could not find)
            source = __loader__.get_data(__file__).decode()  # type: ignore[name-defined]
            self._proc = subprocess.Popen(
                [sys.executable, "-c", source],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        return self._proc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def slim(
        self, model: bytes, input_shapes: list[str], timeout_s: float
    ) -> tuple[bytes, str | None]:
        """The simplified model's bytes, and None; or ``b""`` and onnxslim's error.

        Raises:
            SlimTimeout: no answer within ``timeout_s`` (the child is killed).
            SlimCrashed: the child died.
        """
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                _write(proc.stdin, {"input_shapes": input_shapes}, model)
                header = json.loads(self._read(proc, time.monotonic() + timeout_s))
                payload = self._read(proc, time.monotonic() + timeout_s)
            except (SlimTimeout, SlimCrashed, OSError, ValueError) as e:
                self.close()
                if isinstance(e, SlimTimeout):
                    raise
                raise SlimCrashed(f"the onnxslim process died ({e or type(e).__name__})") from e
            return payload, header.get("error")

    @staticmethod
    def _read(proc: subprocess.Popen, deadline: float) -> bytes:
        """One length-prefixed block from the child's stdout, by ``deadline``."""
        fd = proc.stdout.fileno()  # type: ignore[union-attr]
        out = bytearray()
        want = _LEN.size
        length: int | None = None
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                if len(out) >= want:
                    if length is not None:
                        return bytes(out[_LEN.size :])
                    length = _LEN.unpack(out[: _LEN.size])[0]
                    want = _LEN.size + length
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise SlimTimeout
                chunk = os.read(fd, min(1 << 20, want - len(out)))
                if not chunk:
                    raise SlimCrashed("it closed its output")
                out += chunk


_worker = SlimWorker()
atexit.register(_worker.close)


def slim(model: bytes, input_shapes: list[str], timeout_s: float) -> tuple[bytes, str | None]:
    """:meth:`SlimWorker.slim` on this process's child."""
    return _worker.slim(model, input_shapes, timeout_s)


def _serve() -> None:
    """The child: answer requests until stdin closes."""
    import contextlib
    import io
    import logging

    import onnx
    import onnxruntime as ort
    import onnxslim

    ort.set_default_logger_severity(4)
    logging.getLogger("onnxslim").setLevel(logging.ERROR)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # onnxslim prints; only answers go to the parent
    stdin = sys.stdin.buffer

    def block() -> bytes | None:
        head = stdin.read(_LEN.size)
        if len(head) < _LEN.size:
            return None
        return stdin.read(_LEN.unpack(head)[0])

    while (header := block()) is not None and (data := block()) is not None:
        spec = json.loads(header).get("input_shapes") or None
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                slimmed = onnxslim.slim(onnx.load_model_from_string(data), input_shapes=spec)
            if slimmed is None:
                raise RuntimeError("onnxslim returned no model")
            _write(out, {"error": None}, slimmed.SerializeToString())
        except Exception as e:  # noqa: BLE001 - onnxslim raises bare Exceptions; the parent decides
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            _write(out, {"error": lines[0][:300] if lines else type(e).__name__}, b"")


if __name__ == "__main__":
    _serve()
