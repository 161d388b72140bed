"""Two fleet groups that share a split point batch together on a real ``edgesplit serve``.

The planner puts two groups (different devices, different deadlines) on the same server part;
their devices then send real requests over a shaped link (tests/netlab.py) to a real ``serve
--max-batch 8``. Each answer's ``Server-Timing`` names the run that computed it
(``batch;desc="IDxSIZE"``): some run must hold requests of both groups, and every answer must be
the one ONNX Runtime gives for that request alone.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import make_model, rand
from netlab import NetLab, make_bundle, require_netns, serve_command, wait_ready
from onnx import helper

from edgesplit.fleet import Candidate, Group, Server, plan_fleet
from edgesplit.runtime import oip

pytestmark = [pytest.mark.netlab]

WIDTH = 256


def _model(path) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    onnx.save(
        make_model(
            nodes,
            [("x", [1, WIDTH])],
            [("y", [1, WIDTH])],
            [("w1", rand(WIDTH, WIDTH)), ("w2", rand(WIDTH, WIDTH, seed=1))],
        ),
        path,
    )


def _batch(headers) -> tuple[int, int]:
    for metric in headers.get("Server-Timing", "").split(","):
        name, *params = (p.strip() for p in metric.split(";"))
        if name == "batch":
            bid, _, size = (
                next(p for p in params if p.startswith("desc="))[5:].strip('"').partition("x")
            )
            return int(bid), int(size)
    raise AssertionError(f"no batch in Server-Timing: {headers.get('Server-Timing')!r}")


def test_the_plan_shares_the_split_point():
    shared = Candidate(
        "cut@2", "mlp/cpu/k", device_ms=1.0, energy_mj=1.0, server_ms=2.0, shared_ms=1.5
    )
    local = Candidate("device", None, device_ms=20.0, energy_mj=30.0)
    groups = [
        Group("phones", 8, 20.0, 60.0, "energy", (shared, local)),
        Group("pis", 8, 20.0, 90.0, "energy", (local, shared)),
    ]
    choice = plan_fleet(groups, Server(1, 8, 4.0))
    assert choice.pricing.choice == (0, 1)  # both on the shared server part
    assert choice.server.max_batch == 8


def test_shared_split_points_batch_across_groups(tmp_path):
    require_netns()
    _model(tmp_path / "mlp.onnx")
    bundle = make_bundle(tmp_path / "mlp.onnx", tmp_path / "b", ["r"], [False, True])
    head = ort.InferenceSession(str(bundle / "parts/p0.onnx"))
    tail = ort.InferenceSession(str(bundle / "parts/p1.onnx"))
    # each group's devices send their own inputs (group g, device d)
    inputs = {
        (g, d): head.run(None, {"x": rand(1, WIDTH, seed=10 * g + d + 5)})[0]
        for g in (0, 1)
        for d in range(4)
    }
    expected = {k: tail.run(None, {"r": v})[0] for k, v in inputs.items()}

    with NetLab(200, 0) as lab:
        proc = lab.spawn(
            serve_command(
                bundle,
                lab.server_ip,
                8000,
                "--max-batch",
                "8",
                "--max-queue-delay-ms",
                "30",
                "--threads",
                "1",
            ),
            stderr=subprocess.PIPE,
        )
        url = f"http://{lab.server_ip}:8000"
        wait_ready(url, proc)
        seen = asyncio.run(_send(url, inputs, expected, rounds=5))

    assert len(seen) == 5 * 8
    by_batch: dict[int, set[int]] = {}
    for (g, _), (bid, size) in seen:
        by_batch.setdefault(bid, set()).add(g)
        assert 1 <= size <= 8
    sizes = {bid: sum(1 for _, (b, _) in seen if b == bid) for bid in by_batch}
    mixed = [b for b, gs in by_batch.items() if gs == {0, 1} and sizes[b] > 1]
    assert mixed, f"no run held both groups' requests: {by_batch}"
    assert max(sizes.values()) > 2, sizes


async def _send(url, inputs, expected, rounds: int):
    import aiohttp

    seen = []

    async def one(session, key):
        chunks, hlen = oip.encode_request({"r": inputs[key]})
        headers = {oip.HEADER_LENGTH: str(hlen), "Content-Type": "application/octet-stream"}
        async with session.post(
            f"{url}/v2/models/p1/infer", data=b"".join(bytes(c) for c in chunks), headers=headers
        ) as r:
            data = await r.read()
            assert r.status == 200, data[:200]
            out = oip.decode_response(
                data, oip.parse_header_length(r.headers.get(oip.HEADER_LENGTH), len(data))
            )["y"]
            np.testing.assert_allclose(out, expected[key], rtol=1e-4, atol=1e-5)
            seen.append((key, _batch(r.headers)))

    sessions = {k: aiohttp.ClientSession() for k in inputs}
    try:
        for _ in range(rounds):
            await asyncio.gather(*(one(sessions[k], k) for k in inputs))
    finally:
        for s in sessions.values():
            await s.close()
    return seen


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
