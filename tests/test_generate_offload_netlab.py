"""Prefill on a server over a really shaped link (netns + tbf + delay relay): the tokens are the
local ones, and the cache's transfer really takes the link's time."""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import pytest
from decoder_bundles import decoder_bundle
from netlab import NetLab, require_netns, serve_command, wait_ready

from edgesplit.generate import Generator
from edgesplit.generate.offload import RemotePrefill, measure_server_prefill
from edgesplit.runtime.client import OipClient

pytestmark = [pytest.mark.netlab, pytest.mark.timeout(300)]
MBPS, RTT_MS = 5.0, 10.0


def test_offloaded_prefill_over_a_shaped_link(tmp_path):
    require_netns()
    bundle = decoder_bundle(tmp_path, "decoder_small")
    model = onnx.load(tmp_path / "decoder_small.onnx")
    gen = Generator(model, chunk_tokens=32)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 2048, 96)]
    with NetLab(MBPS, RTT_MS) as lab:
        cmd = serve_command(bundle, lab.server_ip, 8000, "--all-parts", "--max-cache-tokens", "512")
        proc = lab.spawn(cmd, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{lab.relay(8000).port}"
        wait_ready(url, proc)
        client = OipClient(url, timeout_s=60)
        prefill = RemotePrefill(client, "p0", gen.config, timeout_s=60)
        tokens = list(gen.generate(prompt, 10, prefill=prefill))
        assert tokens == list(gen.generate(prompt, 10))
        figs = measure_server_prefill(prefill, prompt, repeats=3)
        client.close()
    # 96 positions of 2 KB: 196 kB down at 5 Mbit/s is 315 ms at the least
    wire_ms = (figs.cache_nbytes + figs.download_fixed_nbytes) * 8 / (MBPS * 1e3)
    assert figs.cache_nbytes == 96 * 2048
    assert figs.elapsed_ms >= 0.95 * (wire_ms + RTT_MS), (figs, wire_ms)
    assert figs.elapsed_ms <= 2.0 * (wire_ms + RTT_MS + figs.server_ms) + 50, (figs, wire_ms)
